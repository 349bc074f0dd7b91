package main

import (
	"math/rand/v2"
	"sync"
	"time"

	"example.com/paymentsd/upstream/upstreamtest"
)

// newProvider starts the fake provider in this process: it makes a payment
// for a key's first request to complete and answers later ones with it
// (DedupOnCompletion), so that two requests at once charge twice; it works
// on after paymentsd goes away (Stubborn), as a real provider does; and it
// takes between minLatency and maxLatency on each request.
func newProvider(apiKey string, minLatency, maxLatency time.Duration, seed uint64) *upstreamtest.Server {
	fake := upstreamtest.NewServer()
	fake.AllowKey(apiKey)
	fake.DedupOnCompletion(true)
	fake.Stubborn(true)
	fake.KeepRequests(false)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	fake.SetScript(func(int, upstreamtest.Request) upstreamtest.Reply {
		mu.Lock()
		defer mu.Unlock()
		d := minLatency
		if maxLatency > minLatency {
			d += time.Duration(rng.Int64N(int64(maxLatency - minLatency)))
		}
		return upstreamtest.Reply{Delay: d}
	})
	return fake
}

// providerFacts reads what the fake saw of every key.
func providerFacts(fake *upstreamtest.Server) map[string]keyFacts {
	out := make(map[string]keyFacts)
	for k, ks := range fake.AllKeyStats() {
		out[k] = keyFacts{Stats: ks, History: fake.KeyHistory(k)}
	}
	return out
}
