package simulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
)

var currencyPattern = regexp.MustCompile(`^[A-Z]+$`)

// simulate is the documented behaviour: authenticate, check the body, and
// succeed with a reply that says it is simulated.
func (s *Server) simulate(r Request, kr *KeyRequest) Reply {
	if refusal, refused := s.check(r); refused {
		return refusal
	}
	return s.create(r, kr)
}

// check authenticates r and checks its body, returning the refusal if any.
func (s *Server) check(r Request) (Reply, bool) {
	if r.Method != http.MethodPost || r.Path != "/v1/multi-card-payments" {
		return errorReply(http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.Path), true
	}
	key := r.Header.Get("X-Api-Key")
	s.mu.Lock()
	permitted, known := s.keys[key]
	s.mu.Unlock()
	switch {
	case key == "" || !known:
		return errorReply(http.StatusUnauthorized, "no valid API key was provided"), true
	case !permitted:
		return errorReply(http.StatusForbidden, "the API key is not authorized for this resource"), true
	}
	if err := checkBody(r); err != nil {
		return errorReply(http.StatusBadRequest, err.Error()), true
	}
	return Reply{}, false
}

// create makes a payment for r, whose entry in its key's history is kr: a
// success reply with an id of its own.
func (s *Server) create(r Request, kr *KeyRequest) Reply {
	var echo bytes.Buffer
	json.Compact(&echo, r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created++
	s.stats(idempotencyKey(r.Body)).Charges++
	kr.Charged = true
	body := fmt.Appendf(nil, `{"id":"pay_sim_%d","simulated":true,"note":"paymentsd simulator: no payment was made","request":%s}`, s.created, echo.Bytes())
	return Reply{Status: http.StatusOK, Body: body}
}

func errorReply(status int, msg string) Reply {
	b, _ := json.Marshal(map[string]any{"simulated": true, "error": msg})
	return Reply{Status: status, Body: b}
}

// checkBody checks the documented request: exactly amountMoney (currency
// in upper-case letters, amount an integer) and a non-empty idempotencyKey.
func checkBody(r Request) error {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("Content-Type is %q, want application/json", ct)
	}
	var top map[string]json.RawMessage
	if err := strictDecode(r.Body, &top); err != nil {
		return fmt.Errorf("body is not a JSON object: %v", err)
	}
	var money map[string]json.RawMessage
	var key string
	if err := exactFields(top, "amountMoney", "idempotencyKey"); err != nil {
		return err
	}
	if err := strictDecode(top["amountMoney"], &money); err != nil {
		return fmt.Errorf("amountMoney is not an object: %v", err)
	}
	if err := exactFields(money, "currency", "amount"); err != nil {
		return fmt.Errorf("amountMoney: %v", err)
	}
	var currency string
	if err := json.Unmarshal(money["currency"], &currency); err != nil || !currencyPattern.MatchString(currency) {
		return fmt.Errorf("amountMoney.currency must be upper-case letters")
	}
	// Into any, not a json.Number, which would also take the string "12".
	var v any
	if err := strictDecode(money["amount"], &v); err != nil {
		return fmt.Errorf("amountMoney.amount must be a number")
	}
	amount, ok := v.(json.Number)
	if !ok {
		return fmt.Errorf("amountMoney.amount must be a number")
	}
	if _, err := strconv.ParseInt(amount.String(), 10, 64); err != nil {
		return fmt.Errorf("amountMoney.amount must be a whole number, got %s", amount)
	}
	if err := json.Unmarshal(top["idempotencyKey"], &key); err != nil || key == "" {
		return fmt.Errorf("idempotencyKey must be a non-empty string")
	}
	return nil
}

func strictDecode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	// d.More would miss a stray ] or }.
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("trailing data")
	}
	return nil
}

func exactFields(m map[string]json.RawMessage, names ...string) error {
	for _, n := range names {
		if _, ok := m[n]; !ok {
			return fmt.Errorf("field %s is missing", n)
		}
	}
	if len(m) != len(names) {
		return fmt.Errorf("unexpected fields: want only %v", names)
	}
	return nil
}
