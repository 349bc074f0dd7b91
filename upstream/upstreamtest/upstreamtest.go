// Package upstreamtest is a fake payment provider, in the style of
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
// paymentsd --simulate runs the same server in-process.
package upstreamtest

import (
	"bytes"
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
	// Successes counts the 2xx replies the fake sent whole for the key,
	// and AfterSuccess the requests with the key that arrived after the
	// first of them: a key sent again after its 2xx.
	Successes    int
	AfterSuccess int
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
		bodies:       make(map[string]map[string]bool),
		canceled:     make(chan struct{}, 4096),
		keepRequests: true,
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	s.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.conns.Add(1)
		}
	}
	if useTLS {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	s.URL = s.srv.URL + "/v1"
	return s
}

// Close shuts the server down, closing its connections.
func (s *Server) Close() {
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
	s.enter(idemKey, body)
	defer s.leave(idemKey)

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
			remembered = s.remember(idemKey, req)
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
			reply = s.completeLate(idemKey, req)
		default:
			reply = s.simulate(req)
		}
	}
	if r.Context().Err() != nil {
		s.noteCanceled()
		return
	}
	s.send(w, r, reply, idemKey)
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
func (s *Server) completeLate(key string, r Request) Reply {
	reply := s.create(r)
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

func (s *Server) enter(key string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight[key]++
	s.maxInFlight[key] = max(s.maxInFlight[key], s.inFlight[key])
	ks := s.stats(key)
	ks.Requests++
	if ks.Successes > 0 {
		ks.AfterSuccess++
	}
	ks.MaxInFlight = s.maxInFlight[key]
	if s.bodies[key] == nil {
		s.bodies[key] = make(map[string]bool)
	}
	if !s.bodies[key][string(body)] {
		s.bodies[key][string(body)] = true
		ks.Bodies++
	}
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

func (s *Server) leave(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight[key]--
}

// remember is the idempotent provider: it creates the payment for a valid
// request the first time its key is seen, and returns the reply every
// request with that key gets; nil when not idempotent or not valid.
func (s *Server) remember(key string, r Request) *Reply {
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
		p = payment{body: r.Body, reply: s.create(r)}
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

// noteSuccess counts a 2xx sent for key.
func (s *Server) noteSuccess(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats(key).Successes++
}

func (s *Server) noteCanceled() {
	select {
	case s.canceled <- struct{}{}:
	default:
	}
}

func (s *Server) send(w http.ResponseWriter, r *http.Request, reply Reply, key string) {
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	switch reply.Fault {
	case Reset, Hangup, CutBody:
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(fmt.Sprintf("upstreamtest: hijack: %v", err))
		}
		defer conn.Close()
		switch reply.Fault {
		case Reset:
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
		case CutBody:
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
	w.WriteHeader(status)
	if reply.Fault != Dribble {
		if _, err := w.Write(reply.Body); err == nil && status >= 200 && status < 300 {
			s.noteSuccess(key)
		}
		return
	}
	rc := http.NewResponseController(w)
	for i := range reply.Body {
		w.Write(reply.Body[i : i+1])
		rc.Flush()
		t := time.NewTimer(reply.DribbleInterval)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			s.noteCanceled()
			return
		}
	}
}

var currencyPattern = regexp.MustCompile(`^[A-Z]+$`)

// simulate is the documented behaviour: authenticate, check the body, and
// succeed with a reply that says it is simulated.
func (s *Server) simulate(r Request) Reply {
	if refusal, refused := s.check(r); refused {
		return refusal
	}
	return s.create(r)
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

// create makes a payment for r: a success reply with an id of its own.
func (s *Server) create(r Request) Reply {
	var echo bytes.Buffer
	json.Compact(&echo, r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created++
	s.stats(idempotencyKey(r.Body)).Charges++
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
