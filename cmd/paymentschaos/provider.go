package main

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"example.com/paymentsd/internal/simulator"
)

// How the fake provider answers a request whose key a completed request
// already used (-provider). The provider's documentation does not say
// (upstream-api.md: "the behaviour when a key is reused: not shown"), so
// paymentsd must be safe with either.
const (
	// providerFirst answers it with the first payment's reply again.
	providerFirst = "first"
	// provider409 answers it 409 Conflict, which proves nothing to
	// paymentsd: the payment may exist, and the key stays in doubt until
	// a person resolves it.
	provider409 = "409"
)

// provider is the fake provider of a run: the simulator, in this process.
type provider struct {
	*simulator.Server
	// unknown, while set, makes every request that arrives answer 503
	// after its latency, creating nothing: paymentsd records the attempt
	// OUTCOME_UNKNOWN (a 503 may come after the work was done).
	unknown atomic.Bool
}

// newProvider starts the fake provider: it makes a payment for a key's
// first request to complete (DedupOnCompletion), so that two requests at
// once charge twice; it works on after paymentsd goes away (Stubborn), as
// a real provider does; it takes between minLatency and maxLatency on
// each request; and a reused key gets the first payment again (mode
// providerFirst) or 409 (provider409).
func newProvider(apiKey, mode string, minLatency, maxLatency time.Duration, seed uint64) *provider {
	p := &provider{Server: simulator.NewServer()}
	p.AllowKey(apiKey)
	p.DedupOnCompletion(true)
	p.Stubborn(true)
	p.KeepRequests(false)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	latency := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		d := minLatency
		if maxLatency > minLatency {
			d += time.Duration(rng.Int64N(int64(maxLatency - minLatency)))
		}
		return d
	}
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		d := latency()
		if p.unknown.Load() {
			return simulator.Reply{Status: http.StatusServiceUnavailable, Body: errorBody("temporarily unavailable"), Delay: d}
		}
		if mode == provider409 {
			// The request being answered is in the key's history already,
			// not charged.
			if slices.ContainsFunc(p.KeyHistory(keyOf(r.Body)), func(kr simulator.KeyRequest) bool { return kr.Charged }) {
				return simulator.Reply{Status: http.StatusConflict, Body: errorBody("idempotency key already used"), Delay: d}
			}
		}
		return simulator.Reply{Delay: d}
	})
	return p
}

func errorBody(msg string) []byte {
	b, _ := json.Marshal(map[string]any{"simulated": true, "error": msg})
	return b
}

// keyOf is a request body's idempotencyKey, or "".
func keyOf(body []byte) string {
	var v struct {
		IdempotencyKey string `json:"idempotencyKey"`
	}
	json.Unmarshal(body, &v)
	return v.IdempotencyKey
}

// providerFacts reads what the fake saw of every key.
func providerFacts(p *provider) map[string]keyFacts {
	out := make(map[string]keyFacts)
	for k, ks := range p.AllKeyStats() {
		out[k] = keyFacts{Stats: ks, History: p.KeyHistory(k)}
	}
	return out
}
