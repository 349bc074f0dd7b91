// Package simulator is a fake payment provider, in the style of
// net/http/httptest. By default it behaves as the provider's documentation
// says: it checks x-api-key (401 when missing or unknown, 403 when known but
// not permitted), checks the request body (400 when it is not the documented
// shape), and answers 200 with a body marked as simulated. Tests can script
// any reply per request: a status, a delay, a malformed or cut-off body, or
// a dropped connection.
//
// With Idempotent(true) it also behaves as an idempotent provider would:
// the first valid request for an idempotency key creates a payment (with an
// id of its own), and every later request with that key and the same body
// gets the same reply, so tests can tell a replay from a double charge.
//
// Per idempotency key it keeps what a checker needs to judge the client:
// counts (KeyStats: requests, overlaps, charges, 2xx replies delivered, and
// requests that came after one was) and every request's story
// (KeyHistory). AddListener gives each of several clients an address of
// its own, so the history says whose request each was.
//
// paymentsd --simulate runs the same server in-process.
package simulator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
)

// Server is a fake payment provider listening on 127.0.0.1.
type Server struct {
	// URL is the base URL, ending in /v1, as the provider's are.
	URL string

	srv          *httptest.Server
	extra        []*http.Server // AddListener's
	conns        atomic.Int64
	canceled     chan struct{}
	mu           sync.Mutex
	keys         map[string]bool // key → permitted
	script       Script
	requests     []Request
	received     int // requests received, recorded or not
	keepRequests bool

	idempotent  bool
	lateDedup   bool               // dedup by keys of completed requests only
	stubborn    bool               // keep working on a request whose client has gone
	created     int                // payments created
	payments    map[string]payment // idempotency key → its payment
	inFlight    map[string]int     // idempotency key → requests being answered
	maxInFlight map[string]int     // idempotency key → most seen at once
	perKey      map[string]*KeyStats
	history     map[string][]*KeyRequest   // idempotency key → its requests
	bodies      map[string]map[string]bool // idempotency key → bodies seen
}

// NewServer starts a fake provider over plain HTTP that knows no keys yet:
// every request is answered 401 until AllowKey is called.
func NewServer() *Server { return newServer(false) }

// NewTLSServer is NewServer over HTTPS, with a self-signed certificate
// (see Certificate), as a live provider would be.
func NewTLSServer() *Server { return newServer(true) }

func newServer(useTLS bool) *Server {
	s := &Server{
		keys:         make(map[string]bool),
		payments:     make(map[string]payment),
		inFlight:     make(map[string]int),
		maxInFlight:  make(map[string]int),
		perKey:       make(map[string]*KeyStats),
		history:      make(map[string][]*KeyRequest),
		bodies:       make(map[string]map[string]bool),
		canceled:     make(chan struct{}, 4096),
		keepRequests: true,
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	s.srv.Config.ConnState = s.countConn
	if useTLS {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	s.URL = s.srv.URL + "/v1"
	return s
}

func (s *Server) countConn(_ net.Conn, state http.ConnState) {
	if state == http.StateNew {
		s.conns.Add(1)
	}
}

// listenerKey is the context key of the name of the listener a request
// came in on.
type listenerKey struct{}

// AddListener starts another listener on 127.0.0.1 for the same fake
// provider (over TLS if the server is) and returns its base URL, ending in
// /v1. Requests that come in on it carry name in KeyHistory, so that a test
// whose clients each get a listener of their own (several paymentsd
// processes, say) can tell whose request each was. Close closes it.
func (s *Server) AddListener(name string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("simulator: listen: %v", err))
	}
	scheme := "http"
	if s.srv.TLS != nil {
		ln, scheme = tls.NewListener(ln, s.srv.TLS), "https"
	}
	srv := &http.Server{
		Handler:   http.HandlerFunc(s.serveHTTP),
		ConnState: s.countConn,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, listenerKey{}, name)
		},
	}
	s.mu.Lock()
	s.extra = append(s.extra, srv)
	s.mu.Unlock()
	go srv.Serve(ln)
	return scheme + "://" + ln.Addr().String() + "/v1"
}

// Close shuts the server down, closing its connections.
func (s *Server) Close() {
	s.mu.Lock()
	extra := s.extra
	s.extra = nil
	s.mu.Unlock()
	for _, srv := range extra {
		srv.Close()
	}
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// AllowKey makes key valid and permitted.
func (s *Server) AllowKey(key string) { s.setKey(key, true) }

// ForbidKey makes key known but not permitted, as a key of the other
// environment or a revoked key is: requests with it get 403.
func (s *Server) ForbidKey(key string) { s.setKey(key, false) }

func (s *Server) setKey(key string, permitted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[key] = permitted
}

// SetScript makes script choose the replies from now on; nil restores the
// default behaviour.
func (s *Server) SetScript(script Script) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = script
}

// Idempotent sets whether the fake remembers payments by idempotency key
// (off by default). When on, a request with a valid key and body creates a
// payment the first time its idempotency key is seen, even when the script
// then delays, holds or spoils the reply (the work was done, the reply was
// lost); only a scripted Status stops it. Later requests with the same key
// and body get the first reply again; with another body, 422.
func (s *Server) Idempotent(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idempotent = on
}

// DedupOnCompletion makes the fake an idempotent provider of a weaker kind
// (off by default): it learns a key only once a request with it completes.
// A request whose key a completed request already used gets that reply
// again; every request that arrives before then makes a payment of its own
// when it completes, so two requests with one key at the provider at once
// charge twice. Tests use it to prove paymentsd never overlaps them.
func (s *Server) DedupOnCompletion(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lateDedup = on
}

// Stubborn sets whether the fake keeps working on a request after its
// client has gone (off by default), as a real provider does: a Delay runs
// to its end, the payment is made, and the request counts as in flight
// until then. Only the reply is lost.
func (s *Server) Stubborn(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stubborn = on
}

// KeepRequests sets whether received requests are recorded (the default).
// Load tests turn it off to keep memory flat.
func (s *Server) KeepRequests(keep bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepRequests = keep
}

// Requests returns the requests received so far, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Connections returns how many connections clients have opened.
func (s *Server) Connections() int64 { return s.conns.Load() }

// Canceled receives a value each time a client goes away while a Delay or
// Dribble reply is pending, which is how a test sees that a caller's
// cancellation reached the provider.
func (s *Server) Canceled() <-chan struct{} { return s.canceled }

// Certificate returns the TLS server's certificate, or nil over plain HTTP.
func (s *Server) Certificate() *x509.Certificate { return s.srv.Certificate() }

// Client returns an HTTP client for the server, with no timeouts of its own.
func (s *Server) Client() *http.Client { return s.srv.Client() }
