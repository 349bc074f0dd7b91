package simulator

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// payment is a payment the idempotent fake created.
type payment struct {
	body  []byte // the request body that created it
	reply Reply
}

// completed is the late-deduplicating provider's check at arrival: the
// reply of a completed request with key, if any.
func (s *Server) completed(key string, r Request) *Reply {
	if key == "" {
		return nil
	}
	if refusal, refused := s.check(r); refused {
		return &refusal
	}
	s.mu.Lock()
	p, ok := s.payments[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if !bytes.Equal(p.body, r.Body) {
		reply := errorReply(http.StatusUnprocessableEntity, "idempotency key reused with a different request")
		return &reply
	}
	return &p.reply
}

// completeLate makes the payment of a request that arrived when no
// completed request had used its key, and remembers the first one made.
func (s *Server) completeLate(key string, r Request, kr *KeyRequest) Reply {
	reply := s.create(r, kr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.payments[key]; !ok && key != "" {
		s.payments[key] = payment{body: r.Body, reply: reply}
	}
	return reply
}

// idempotencyKey returns the body's idempotencyKey, or "".
func idempotencyKey(body []byte) string {
	var v struct {
		IdempotencyKey string `json:"idempotencyKey"`
	}
	json.Unmarshal(body, &v)
	return v.IdempotencyKey
}

// remember is the idempotent provider: it creates the payment for a valid
// request the first time its key is seen, and returns the reply every
// request with that key gets; nil when not idempotent or not valid.
func (s *Server) remember(key string, r Request, kr *KeyRequest) *Reply {
	s.mu.Lock()
	idempotent := s.idempotent
	s.mu.Unlock()
	if !idempotent || key == "" {
		return nil
	}
	if refusal, refused := s.check(r); refused {
		return &refusal // nothing is created or remembered
	}
	s.mu.Lock()
	p, ok := s.payments[key]
	s.mu.Unlock()
	if !ok {
		p = payment{body: r.Body, reply: s.create(r, kr)}
		s.mu.Lock()
		if first, raced := s.payments[key]; raced {
			p = first // a concurrent request created it first
		} else {
			s.payments[key] = p
		}
		s.mu.Unlock()
	}
	if !bytes.Equal(p.body, r.Body) {
		reply := errorReply(http.StatusUnprocessableEntity, "idempotency key reused with a different request")
		return &reply
	}
	return &p.reply
}
