package simulator

import (
	"net/http"
	"time"
)

// Fault is a way for a reply to go wrong at the transport level.
type Fault int

const (
	// NoFault sends the reply normally.
	NoFault Fault = iota
	// Reset resets the connection (TCP RST) instead of replying.
	Reset
	// Hangup closes the connection instead of replying: the client reads
	// EOF before any response.
	Hangup
	// CutBody sends the status line, headers and a Content-Length for the
	// whole body, then half the body, then closes the connection.
	CutBody
	// Dribble sends the body one byte at a time, DribbleInterval apart.
	Dribble
)

// Reply is how the fake answers one request. The zero Reply means the
// default behaviour: check the key and body, then answer success.
type Reply struct {
	// Status, if not zero, is sent without checking the key or body.
	Status int
	// Header is added to the reply.
	Header http.Header
	// Body is the reply body.
	Body []byte
	// Delay is waited before replying, or until the client goes away.
	Delay time.Duration
	// Wait, if not nil, holds the reply until it is closed or the client
	// goes away, so a test can keep a call in flight as long as it likes.
	Wait <-chan struct{}
	// Fault, if set, replaces or spoils the reply.
	Fault Fault
	// DribbleInterval is the pause between bytes for Dribble.
	DribbleInterval time.Duration
}

// Request is a request the fake received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Script chooses the reply to the n-th request (counting from 1).
type Script func(n int, r Request) Reply

// Sequence replies to the n-th request with replies[n-1], then by default.
func Sequence(replies ...Reply) Script {
	return func(n int, _ Request) Reply {
		if n <= len(replies) {
			return replies[n-1]
		}
		return Reply{}
	}
}

// Always replies to every request with r.
func Always(r Reply) Script {
	return func(int, Request) Reply { return r }
}
