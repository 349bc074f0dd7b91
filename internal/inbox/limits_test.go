package inbox_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/testenv"
)

// escape percent-encodes every byte of s.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// TestOnlyTheExactTargetDelivers: the intake matched the decoded path, so
// /webhooks%2F{token} and /webhooks/%74… were deliveries, and an absolute
// URL's host was stored as Host. Now only the target exactly as
// configured (a query aside) is one; and a token anywhere in a stored
// header, in any of those forms, is redacted.
func TestOnlyTheExactTargetDelivers(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	refused := []string{
		"/webhooks%2F" + token,
		"/webhooks%2f" + token,
		"/webhooks/" + escape(token[:1]) + token[1:],
		"/webhooks/" + token[:5] + escape(token[5:6]) + token[6:],
		"/webhooks/" + escape(token),
		"http://evil.example/webhooks/" + token,
		"http://hooks.example.com/webhooks/" + token,
	}
	for _, target := range refused {
		resp := in.raw(t, "POST "+target+" HTTP/1.1\r\nHost: hooks.example.com\r\nContent-Length: 2\r\n\r\n{}")
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s = %d, want 404", target, resp.StatusCode)
		}
	}
	if got := in.events(t); len(got) != 0 {
		t.Fatalf("stored %d events from escaped or absolute targets, want 0", len(got))
	}

	forms := map[string]string{
		"X-Original-Uri":  "/webhooks%2F" + token,
		"X-Forwarded-Uri": "/webhooks/" + escape(token[:1]) + token[1:],
		"X-Double":        "/webhooks/" + strings.ReplaceAll(escape(token), "%", "%25"),
		"X-Lower":         strings.ToLower(escape(token)),
		"Referer":         "https://x.example/?u=" + token + "&v=1",
		"X-Twice":         token + "," + token,
		// A header's name may hold it too (a proxy naming a header
		// after the path it forwarded).
		"X-" + token: "1",
	}
	req := "POST /webhooks/" + token + "?x=1 HTTP/1.1\r\nHost: hooks.example.com\r\nContent-Length: 2\r\n"
	for k, v := range forms {
		req += k + ": " + v + "\r\n"
	}
	if resp := in.raw(t, req+"\r\n{}"); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /webhooks/{token}?x=1 = %d, want 200", resp.StatusCode)
	}
	got := in.events(t)
	if len(got) != 1 {
		t.Fatalf("stored %d events, want 1", len(got))
	}
	seen := map[string]string{}
	for _, h := range got[0].Headers {
		seen[h.Name] = h.Value
		if leaksToken(h.Name) {
			t.Errorf("stored header name %q holds the token", h.Name)
		}
		if leaksToken(h.Value) {
			t.Errorf("stored header %s = %q holds the token", h.Name, h.Value)
		}
	}
	if seen["Host"] != "hooks.example.com" || seen["Referer"] != "https://x.example/?u=[REDACTED]&v=1" || seen["X-Twice"] != "[REDACTED],[REDACTED]" {
		t.Errorf("stored Host, Referer, X-Twice = %q, %q, %q; want the Host header, and the tokens replaced in place", seen["Host"], seen["Referer"], seen["X-Twice"])
	}
}

// TestHeaderBound: the README promised 8 KiB of header, and net/http let
// 12,000 bytes through (it adds 4096 to MaxHeaderBytes).
func TestHeaderBound(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	request := func(total int) string {
		head := "POST /webhooks/" + token + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Pad: "
		pad := total - len(head) - len("\r\n\r\n")
		return head + strings.Repeat("a", pad) + "\r\n\r\n{}"
	}
	if resp := in.raw(t, request(7<<10)); resp.StatusCode != http.StatusOK {
		t.Errorf("7 KiB of request line and header = %d, want 200", resp.StatusCode)
	}
	for _, n := range []int{8<<10 + 1, 12000} {
		if resp := in.raw(t, request(n)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%d bytes of request line and header = %d, want 431", n, resp.StatusCode)
		}
	}
}

// TestProbesCountedApart: /healthz, /metrics and the like on the webhook
// port were counted as bad_token, the outcome a rotation watches.
func TestProbesCountedApart(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	for _, path := range []string{"/healthz", "/metrics", "/readyz", "/"} {
		if status, _, _ := in.do(t, http.MethodGet, path, nil, nil); status != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, status)
		}
	}
	want := map[string]float64{inbox.OutcomeNotFound: 4}
	if diff := cmp.Diff(want, in.deliveries(t)); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}

// TestTokenLabel: the delivery metrics say which token each delivery
// carried, so a rotation shows when the old one falls silent.
func TestTokenLabel(t *testing.T) {
	t.Parallel()
	in := startIntake(t, oldToken, token)
	for range 2 {
		in.do(t, http.MethodPost, "/webhooks/"+oldToken, strings.NewReader("{}"), nil)
	}
	in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader("{}"), nil)
	in.do(t, http.MethodPost, "/webhooks/"+strings.Repeat("w", 40), strings.NewReader("{}"), nil)
	got := map[string]float64{}
	for _, s := range in.series(t, "paymentsd_webhook_deliveries_total") {
		if s.value > 0 {
			got[s.labels["outcome"]+"/"+s.labels["token"]] = s.value
		}
	}
	want := map[string]float64{"stored/first": 1, "duplicate/first": 1, "duplicate/second": 1, "bad_token/none": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deliveries by outcome/token (-want +got):\n%s", diff)
	}
	if !strings.Contains(in.logs.String(), `"token":"second"`) {
		t.Errorf("no access line names the second token:\n%s", in.logs.String())
	}
}

// closedByServer reports whether the server closes conn without sending
// anything more, well before the header timeout would close it anyway.
func closedByServer(t *testing.T, r *bufio.Reader, conn net.Conn) bool {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(inbox.ReadHeaderTimeout / 3))
	_, err := r.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestTokenlessConnectionsClosed: a connection that has not shown a token
// is closed after its answer, so a stranger can't hold one idle; one that
// delivered is kept alive for its next delivery.
func TestTokenlessConnectionsClosed(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	conn, err := net.Dial("tcp", in.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !resp.Close {
		t.Errorf("GET /x = %d, Connection: close %v; want 404 and close", resp.StatusCode, resp.Close)
	}
	if !closedByServer(t, r, conn) {
		t.Error("the connection that showed no token stayed open")
	}

	kept, err := net.Dial("tcp", in.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	kr := bufio.NewReader(kept)
	for i, target := range []string{"/webhooks/" + token, "/x", "/webhooks/" + token} {
		fmt.Fprintf(kept, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", target)
		resp, err := http.ReadResponse(kr, nil)
		if err != nil {
			t.Fatalf("request %d on a connection that delivered: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			t.Errorf("request %d (%d) on a connection that delivered asked to close it", i+1, resp.StatusCode)
		}
	}
}

// TestServerWideOptionsClosed: net/http answered "OPTIONS *" itself, 200
// with keep-alive and never through the handler, so a stranger could hold
// a connection as long as it liked by sending one every few seconds, and
// no metric counted it. It is now an unknown target like any other: 404,
// counted, and the connection closed.
func TestServerWideOptionsClosed(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	conn, err := net.Dial("tcp", in.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	io.WriteString(conn, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !resp.Close {
		t.Errorf("OPTIONS * = %d, Connection: close %v; want 404 and close", resp.StatusCode, resp.Close)
	}
	if !closedByServer(t, r, conn) {
		t.Error("the connection that sent OPTIONS * stayed open")
	}
	if got := in.deliveries(t)[inbox.OutcomeNotFound]; got != 1 {
		t.Errorf("not_found deliveries = %v, want 1", got)
	}
}

// dialFrom connects to addr from the loopback address ip.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		testenv.Missing(t, "dial from %s: %v", ip, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dropped returns paymentsd_webhook_connections_dropped_total{reason}.
func (in *intake) dropped(t *testing.T, reason string) float64 {
	t.Helper()
	for _, s := range in.series(t, "paymentsd_webhook_connections_dropped_total") {
		if s.labels["reason"] == reason {
			return s.value
		}
	}
	return 0
}

// TestConnectionsPerAddress: one address holds at most PerIP connections;
// another still delivers.
func TestConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	in := startIntakeWith(t, intakeOptions{limits: inbox.ConnLimits{Max: 100, PerIP: 4}}, token)
	var held []net.Conn
	for range 4 {
		c := dialFrom(t, "127.0.0.2", in.addr)
		io.WriteString(c, "GET /x HTTP/1.1\r\n") // a header never finished
		held = append(held, c)
	}
	extra := dialFrom(t, "127.0.0.2", in.addr)
	if !closedByServer(t, bufio.NewReader(extra), extra) {
		t.Error("a connection past the address's share stayed open")
	}
	if n := in.dropped(t, "per_ip"); n != 1 {
		t.Errorf("connections refused per address = %v, want 1", n)
	}
	if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader("{}"), nil); status != http.StatusOK {
		t.Errorf("delivery from another address = %d, want 200", status)
	}
}

// TestFullPortEvictsTokenless: with the port full of connections that have
// shown no token, a new one takes the oldest's place; with it full of
// connections that delivered, a new one is refused.
func TestFullPortEvictsTokenless(t *testing.T) {
	t.Parallel()
	const max = 8
	in := startIntakeWith(t, intakeOptions{limits: inbox.ConnLimits{Max: max}}, token)
	var idle []net.Conn
	for range max {
		c, err := net.Dial("tcp", in.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET /x HTTP/1.1\r\n")
		idle = append(idle, c)
	}
	if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader("{}"), nil); status != http.StatusOK {
		t.Errorf("delivery with the port full of tokenless connections = %d, want 200", status)
	}
	if !closedByServer(t, bufio.NewReader(idle[0]), idle[0]) {
		t.Error("the oldest tokenless connection was not the one closed")
	}
	if n := in.dropped(t, "evicted"); n < 1 {
		t.Errorf("connections evicted = %v, want at least 1", n)
	}

	// Token holders are never evicted: with every connection theirs, the
	// new one is refused.
	full := startIntakeWith(t, intakeOptions{limits: inbox.ConnLimits{Max: 2}}, token)
	for range 2 {
		c, err := net.Dial("tcp", full.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /webhooks/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", token)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("delivery = %v, %v; want 200", resp, err)
		}
	}
	c, err := net.Dial("tcp", full.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedByServer(t, bufio.NewReader(c), c) {
		t.Error("a connection past a port full of token holders stayed open")
	}
	if n := full.dropped(t, "full"); n != 1 {
		t.Errorf("connections refused as full = %v, want 1", n)
	}
}

// TestOverQuota: past the inbox's quota a delivery gets 503 with
// Retry-After, counted as over_quota and logged without the token.
func TestOverQuota(t *testing.T) {
	t.Parallel()
	in := startIntakeWith(t, intakeOptions{store: store.Options{InboxQuota: 2 << 10}}, token)
	var status int
	var header http.Header
	for i := 0; i < 10 && status != http.StatusServiceUnavailable; i++ {
		status, header, _ = in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader(strings.Repeat("q", 500)+fmt.Sprint(i)), nil)
	}
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") == "" {
		t.Fatalf("delivery past the quota = %d (Retry-After %q), want 503 with Retry-After", status, header.Get("Retry-After"))
	}
	if d := in.deliveries(t); d[inbox.OutcomeOverQuota] != 1 {
		t.Errorf("deliveries = %v, want over_quota 1", d)
	}
	if leaksToken(in.logs.String()) || !strings.Contains(in.logs.String(), `"level":"WARN","msg":"webhook"`) {
		t.Errorf("logs hold the token, or no warning for the refusal:\n%s", in.logs.String())
	}
	if got := gaugeValue(t, in.registry, "paymentsd_webhook_max_stored_bytes"); got != 2<<10 {
		t.Errorf("paymentsd_webhook_max_stored_bytes = %d, want %d", got, 2<<10)
	}
}
