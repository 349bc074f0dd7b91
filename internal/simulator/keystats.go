package simulator

import (
	"time"
)

// KeyStats is what the fake saw of one idempotency key.
type KeyStats struct {
	// Requests counts the requests received with the key.
	Requests int
	// MaxInFlight is the most of them the fake was working on at once.
	MaxInFlight int
	// Bodies counts the distinct request bodies sent with the key.
	Bodies int
	// Charges counts the payments the fake made for the key: more than
	// one is a double charge.
	Charges int
	// Overlaps counts the requests that arrived while another request
	// with the key was being answered.
	Overlaps int
	// Delivered counts the 2xx replies for the key written in full to the
	// client's connection. The fake can't see whether the client read
	// one: a client killed just after it was written still counts.
	Delivered int
	// AfterDelivered counts the requests that arrived after a 2xx reply
	// for the key had been delivered: the key sent again by a client that
	// had been told of a success (unless it died before reading it).
	AfterDelivered int
}

// KeyRequest is one request with an idempotency key, as the fake saw it.
type KeyRequest struct {
	// Listener is the name of the listener the request came in on (see
	// AddListener), or "" for URL's.
	Listener string
	// Arrived is when the fake had read the request; Ended is when it was
	// done with it (just before the last byte of its reply went out), or
	// zero while it is still being answered.
	Arrived, Ended time.Time
	// Status is the status line sent, or 0 if none was: the client went
	// away first, or a Reset or Hangup fault.
	Status int
	// Charged reports whether the request made a payment.
	Charged bool
	// Delivered reports whether a 2xx reply to it was written in full.
	Delivered bool
}

// KeyStats returns what the fake saw of idempotency key.
func (s *Server) KeyStats(key string) KeyStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks, ok := s.perKey[key]; ok {
		return *ks
	}
	return KeyStats{}
}

// AllKeyStats returns what the fake saw of every idempotency key.
func (s *Server) AllKeyStats() map[string]KeyStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]KeyStats, len(s.perKey))
	for k, ks := range s.perKey {
		out[k] = *ks
	}
	return out
}

// KeyHistory returns every request with idempotency key that the fake
// received, in arrival order.
func (s *Server) KeyHistory(key string) []KeyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]KeyRequest, len(s.history[key]))
	for i, kr := range s.history[key] {
		out[i] = *kr
	}
	return out
}

// InFlight returns how many requests the fake is working on now.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.inFlight {
		n += v
	}
	return n
}

// Created returns how many payments the fake has created: with
// Idempotent(true), at most one per idempotency key.
func (s *Server) Created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}

// MaxInFlight returns the most requests with idempotency key that the fake
// was answering at once.
func (s *Server) MaxInFlight(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight[key]
}

// enter counts a request with key as it arrives, and returns its entry in
// the key's history.
func (s *Server) enter(key string, body []byte, via string) *KeyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.stats(key)
	if s.inFlight[key] > 0 {
		ks.Overlaps++
	}
	if ks.Delivered > 0 {
		ks.AfterDelivered++
	}
	s.inFlight[key]++
	s.maxInFlight[key] = max(s.maxInFlight[key], s.inFlight[key])
	ks.Requests++
	ks.MaxInFlight = s.maxInFlight[key]
	kr := &KeyRequest{Listener: via, Arrived: time.Now()}
	s.history[key] = append(s.history[key], kr)
	if s.bodies[key] == nil {
		s.bodies[key] = make(map[string]bool)
	}
	if !s.bodies[key][string(body)] {
		s.bodies[key][string(body)] = true
		ks.Bodies++
	}
	return kr
}

// stats returns key's KeyStats, with s.mu held.
func (s *Server) stats(key string) *KeyStats {
	ks, ok := s.perKey[key]
	if !ok {
		ks = &KeyStats{}
		s.perKey[key] = ks
	}
	return ks
}

// leave notes that the fake is done with a request, if send has not.
func (s *Server) leave(key string, kr *KeyRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveLocked(key, kr)
}

func (s *Server) leaveLocked(key string, kr *KeyRequest) {
	if kr.Ended.IsZero() {
		s.inFlight[key]--
		kr.Ended = time.Now()
	}
}

// finish notes that the fake is done with a request whose reply's status
// line (0 for none) is going out, and whether it is a 2xx whose every byte
// but the last has been written: it counts as delivered unless the last
// fails too (undeliver).
func (s *Server) finish(key string, kr *KeyRequest, status int, delivered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveLocked(key, kr)
	kr.Status = status
	if delivered {
		s.stats(key).Delivered++
		kr.Delivered = true
	}
}

func (s *Server) undeliver(key string, kr *KeyRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats(key).Delivered--
	kr.Delivered = false
}
