package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// heldConn opens a connection to addr that holds its slot the way kind
// says, until the test ends: "idle" sends nothing, "preface" only the
// HTTP/2 client preface (as a gRPC probe's first bytes), "header" an
// HTTP/1.1 request header that never ends, "slow" one byte of a request.
func heldConn(t *testing.T, addr, kind string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	var b string
	switch kind {
	case "idle":
	case "preface":
		b = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	case "header":
		b = "GET /readyz HTTP/1.1\r\nHost: paymentsd\r\nX-Slow: "
	case "slow":
		b = "G"
	default:
		t.Fatalf("held connection kind %q", kind)
	}
	if b != "" {
		if _, err := io.WriteString(c, b); err != nil {
			t.Fatalf("write to %s: %v", addr, err)
		}
	}
}

var heldKinds = []string{"idle", "preface", "header", "slow"}

// TestProbesAnsweredWhileConnectionsAreHeld: with 100 connections held
// open on the health port (idle, an HTTP/2 preface and nothing more, an
// HTTP/1.1 header that never ends, a byte at a time), and 100 more on the
// metrics port, every kubelet probe (gRPC, readiness and liveness) and
// /readyz are answered, and so is every scrape: a held connection makes
// room for a new one, rather than the new one being turned away. Held
// connections keep coming between probes, as an attacker's would.
func TestProbesAnsweredWhileConnectionsAreHeld(t *testing.T) {
	t.Parallel()
	in := start(t, with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_HEALTH_ADDR", "127.0.0.1:0", "PAYMENTS_METRICS_ADDR", "127.0.0.1:0"))
	serving := in.logs.lines("serving")[0]
	healthAddr, metricsAddr := serving["health_addr"].(string), serving["metrics_addr"].(string)
	for round := range 3 {
		for i := range 100 {
			heldConn(t, healthAddr, heldKinds[i%len(heldKinds)])
			heldConn(t, metricsAddr, heldKinds[i%len(heldKinds)])
		}
		for _, svc := range []string{"", "liveness"} {
			if got, err := grpcProbe(t, healthAddr, svc); err != nil || got.String() != "SERVING" {
				t.Errorf("round %d: gRPC probe of service %q with 100 connections held = %v, %v; want SERVING", round, svc, got, err)
			}
		}
		if code := httpProbe(t, "http://"+healthAddr+"/readyz"); code != http.StatusOK {
			t.Errorf("round %d: GET /readyz with 100 connections held = %d, want 200", round, code)
		}
		if code, body := scrapeOnce(t, metricsAddr); code != http.StatusOK || !strings.Contains(body, "paymentsd_ready") {
			t.Errorf("round %d: GET /metrics with 100 connections held = %d, want 200 and the metrics", round, code)
		}
	}
}

// scrapeOnce GETs /metrics from addr on a connection of its own, as a
// scraper that has just started does.
func scrapeOnce(t *testing.T, addr string) (int, string) {
	t.Helper()
	transport := &http.Transport{DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport, Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
