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
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
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

// payment is a payment the idempotent fake created.
type payment struct {
	body  []byte // the request body that created it
	reply Reply
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

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}

	s.mu.Lock()
	s.received++
	n := s.received
	if s.keepRequests {
		s.requests = append(s.requests, req)
	}
	script := s.script
	s.mu.Unlock()

	idemKey := idempotencyKey(body)
	via, _ := r.Context().Value(listenerKey{}).(string)
	kr := s.enter(idemKey, body, via)
	defer s.leave(idemKey, kr)

	var reply Reply
	if script != nil {
		reply = script(n, req)
	}
	s.mu.Lock()
	lateDedup, stubborn := s.lateDedup, s.stubborn
	s.mu.Unlock()
	var remembered *Reply
	if reply.Status == 0 {
		if lateDedup {
			remembered = s.completed(idemKey, req)
		} else {
			remembered = s.remember(idemKey, req, kr)
		}
	}
	// gone is closed when the client goes away, unless the fake is
	// stubborn: then it works on regardless, and only the reply is lost.
	gone := r.Context().Done()
	if stubborn {
		gone = nil
	}
	if reply.Delay > 0 {
		t := time.NewTimer(reply.Delay)
		select {
		case <-t.C:
		case <-gone:
			t.Stop()
			s.noteCanceled()
			return
		}
	}
	if reply.Wait != nil {
		select {
		case <-reply.Wait:
		case <-gone:
			s.noteCanceled()
			return
		}
	}
	if reply.Status == 0 && reply.Fault == NoFault {
		switch {
		case remembered != nil:
			reply = *remembered
		case lateDedup:
			reply = s.completeLate(idemKey, req, kr)
		default:
			reply = s.simulate(req, kr)
		}
	}
	if r.Context().Err() != nil {
		s.noteCanceled()
		return
	}
	s.send(w, r, reply, idemKey, kr)
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

func (s *Server) noteCanceled() {
	select {
	case s.canceled <- struct{}{}:
	default:
	}
}

// send writes reply, and notes in kr what was sent. Its last byte goes
// only once the fake is done with the request (see finish), so a client
// that has read the whole reply finds the request's history complete, and
// its next request is never counted as an overlap.
func (s *Server) send(w http.ResponseWriter, r *http.Request, reply Reply, key string, kr *KeyRequest) {
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	switch reply.Fault {
	case Reset, Hangup, CutBody:
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(fmt.Sprintf("simulator: hijack: %v", err))
		}
		defer conn.Close()
		switch reply.Fault {
		case Reset:
			s.finish(key, kr, 0, false)
			// Under TLS, reset the TCP connection beneath: closing the
			// tls.Conn would first send close_notify, a clean end.
			raw := conn
			if tc, ok := conn.(*tls.Conn); ok {
				raw = tc.NetConn()
			}
			if tc, ok := raw.(*net.TCPConn); ok {
				tc.SetLinger(0)
				tc.Close()
			}
		case Hangup:
			s.finish(key, kr, 0, false)
		case CutBody:
			s.finish(key, kr, status, false)
			fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
				status, http.StatusText(status), len(reply.Body))
			buf.Write(reply.Body[:len(reply.Body)/2])
			buf.Flush()
		}
		return
	}

	for k, vs := range reply.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(reply.Body)))
	s.mu.Lock()
	kr.Status = status
	s.mu.Unlock()
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	head, tail := reply.Body, []byte(nil)
	if n := len(reply.Body); n > 0 {
		head, tail = reply.Body[:n-1], reply.Body[n-1:]
	}
	written := true
	if reply.Fault == Dribble {
		for i := range head {
			if _, err := w.Write(head[i : i+1]); err != nil || rc.Flush() != nil {
				written = false
			}
			t := time.NewTimer(reply.DribbleInterval)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				s.noteCanceled()
				return
			}
		}
	} else if len(head) > 0 {
		_, err := w.Write(head)
		written = err == nil && rc.Flush() == nil
	}
	success := status >= 200 && status <= 299
	s.finish(key, kr, status, written && success)
	if _, err := w.Write(tail); (err != nil || rc.Flush() != nil) && written && success {
		s.undeliver(key, kr)
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
