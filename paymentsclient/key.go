package paymentsclient

import "crypto/rand"

// NewIdempotencyKey returns a new random idempotency key: 26 characters of
// base32 (A–Z, 2–7) holding 128 bits from crypto/rand, so two payments
// never share one by chance. Make one when the customer decides to pay,
// store it with the order, and use it for every retry of that payment.
func NewIdempotencyKey() string {
	return rand.Text()
}
