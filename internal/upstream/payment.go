package upstream

import (
	"encoding/json"
)

// Payment is a create-payment request, in the provider's terms.
type Payment struct {
	Currency       string
	Amount         int64
	IdempotencyKey string
}

// wireRequest is the provider's documented request body. encoding/json
// writes Amount as a JSON integer, exact for every int64.
type wireRequest struct {
	AmountMoney struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	} `json:"amountMoney"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// EncodeRequest returns the provider's request body for p: the documented
// JSON shape, with Amount as an exact JSON integer. The same p always gives
// the same bytes.
func EncodeRequest(p Payment) ([]byte, error) {
	var w wireRequest
	w.AmountMoney.Currency = p.Currency
	w.AmountMoney.Amount = p.Amount
	w.IdempotencyKey = p.IdempotencyKey
	return json.Marshal(&w)
}
