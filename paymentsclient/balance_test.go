package paymentsclient_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver/dns"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/paymentsclient"
)

// grpcMinResolutionInterval is grpc-go's default least time between two
// lookups of a dns:/// target (resolver/dns.SetMinResolutionInterval),
// which a test that shortens it puts back.
const grpcMinResolutionInterval = 30 * time.Second

// TestNewReplicaGetsCalls: a client dialled with DialOptions, through a
// name that resolves to replicas A and B, spreads its calls over both;
// when replica C is added to the name, as a headless Service adds a pod
// that became ready, C gets its share of the calls once a connection
// closes, with no restart of the caller. paymentsd closes connections
// after service.MaxConnectionAge, scaled here from 20 s to 500 ms, and
// gRPC's least time between lookups from 30 s to 10 ms;
// BenchmarkNewReplicaTraffic measures the real ones.
func TestNewReplicaGetsCalls(t *testing.T) {
	// Not parallel: the lookup interval is grpc-go's, for the whole
	// process. Other tests dial IP addresses, which are never looked up.
	dns.SetMinResolutionInterval(10 * time.Millisecond)
	t.Cleanup(func() { dns.SetMinResolutionInterval(grpcMinResolutionInterval) })
	age := grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 500 * time.Millisecond, MaxConnectionAgeGrace: 10 * time.Second})
	f := startFleet(t, 3, age)
	ns := startNameServer(t, f.ips[:2]...)
	calls := newCallLog()
	conn, err := grpc.NewClient(f.target(ns),
		append(paymentsclient.DialOptions(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(calls.record))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := paymentsclient.New(conn)
	pay := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if _, err := c.Create(ctx, payment(paymentsclient.NewIdempotencyKey())); err != nil {
			t.Fatalf("Create = %v, want a payment", err)
		}
	}
	// Not a measurement: without it, a client that never spreads its
	// calls would keep the test running until the binary's timeout.
	watchdog := time.Now().Add(time.Minute)
	until := func(what string, done func() bool) {
		t.Helper()
		for !done() {
			if time.Now().After(watchdog) {
				t.Fatalf("after %d calls (%v), %s", calls.len(), calls.counts(), what)
			}
			pay()
		}
	}

	until("the calls never reached both replicas A and B", func() bool {
		n := calls.counts()
		return n[f.ips[0]] > 0 && n[f.ips[1]] > 0
	})
	ns.Set(f.ips...)
	until("replica C, added to the name, got no call", func() bool { return calls.counts()[f.ips[2]] > 0 })
	// C takes its turn with the others from now on.
	from := calls.len()
	for range 30 {
		pay()
	}
	if n := calls.countsSince(from)[f.ips[2]]; n < 3 {
		t.Errorf("replica C got %d of the 30 calls after its first (%v); want its share, a third while it is connected", n, calls.countsSince(from))
	}
	if n := len(f.provider.AllKeyStats()); n != calls.len() {
		t.Errorf("the provider saw %d keys, want the %d payments made", n, calls.len())
	}
}

// BenchmarkNewReplicaTraffic measures how soon a replica added to
// paymentsd's headless Service gets calls from a client that is already
// running, with the numbers as deployed: paymentsd's own keepalive
// (service.MaxConnectionAge), grpc-go's 30 s between lookups, and
// DialOptions. A client pays 50 times a second through a name that lists
// replicas A and B; at a random moment within the 30 s between lookups the
// name gains C (the DNS stand-in answers at once: a cluster's DNS adds its
// TTL). It reports the seconds until C's first call, and until C had a
// third of the last 30 calls, the most of any iteration. One iteration
// takes up to a minute:
//
//	go test -run '^$' -bench NewReplicaTraffic -benchtime 5x ./paymentsclient/
func BenchmarkNewReplicaTraffic(b *testing.B) {
	dns.SetMinResolutionInterval(grpcMinResolutionInterval)
	var worstFirst, worstShare time.Duration
	for range b.N {
		first, share := newReplicaTraffic(b)
		b.Logf("new replica: first call after %.1f s, a third of the calls after %.1f s", first.Seconds(), share.Seconds())
		worstFirst, worstShare = max(worstFirst, first), max(worstShare, share)
	}
	b.ReportMetric(worstFirst.Seconds(), "s-to-first-call")
	b.ReportMetric(worstShare.Seconds(), "s-to-share")
	b.ReportMetric(0, "ns/op")
}

func newReplicaTraffic(b *testing.B) (first, share time.Duration) {
	f := startFleet(b, 3)
	ns := startNameServer(b, f.ips[:2]...)
	calls := newCallLog()
	conn, err := grpc.NewClient(f.target(ns),
		append(paymentsclient.DialOptions(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(calls.record))...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := paymentsclient.New(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var added time.Time
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	addAt := time.Now().Add(rand.N(grpcMinResolutionInterval))
	for first == 0 || share == 0 {
		select {
		case <-ctx.Done():
			b.Fatalf("after %d calls (%v), replica C had no share", calls.len(), calls.counts())
		case <-tick.C:
		}
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Create(pctx, payment(paymentsclient.NewIdempotencyKey()))
		pcancel()
		if err != nil {
			b.Fatalf("Create = %v", err)
		}
		if added.IsZero() && time.Now().After(addAt) {
			ns.Set(f.ips...)
			added = time.Now()
		}
		if added.IsZero() {
			continue
		}
		if first == 0 && calls.counts()[f.ips[2]] > 0 {
			first = time.Since(added)
		}
		if n := calls.len(); share == 0 && n >= 30 && calls.countsSince(n - 30)[f.ips[2]] >= 10 {
			share = time.Since(added)
		}
	}
	return first, share
}

// fleet is n replicas of paymentsd listening on one port at 127.0.0.1,
// 127.0.0.2, …, as pods behind a headless Service, whose name gives
// addresses, not ports. They share one record store and fake provider, as
// replicas share a database: here one paymentsd serves every address.
type fleet struct {
	*paymentsd
	port int
	ips  []netip.Addr
}

func startFleet(tb testing.TB, n int, grpcOptions ...grpc.ServerOption) *fleet {
	tb.Helper()
	lns := listenSamePort(tb, n)
	dir, err := os.MkdirTemp("", "paymentsclient-fleet")
	if err != nil {
		tb.Fatal(err)
	}
	p, stop, err := launch(dir, paymentsdOptions{listeners: lns, grpcOptions: grpcOptions})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stop()
		os.RemoveAll(dir)
	})
	f := &fleet{paymentsd: p, port: lns[0].Addr().(*net.TCPAddr).Port}
	for _, ln := range lns {
		f.ips = append(f.ips, ln.Addr().(*net.TCPAddr).AddrPort().Addr().Unmap())
	}
	return f
}

// target is the fleet's name, looked up with ns.
func (f *fleet) target(ns *nameServer) string {
	return fmt.Sprintf("dns://%s/paymentsd-grpc.test:%d", ns.addr(), f.port)
}

// listenSamePort listens on one port at n loopback addresses, 127.0.0.1
// to 127.0.0.n.
func listenSamePort(tb testing.TB, n int) []net.Listener {
	tb.Helper()
	for range 20 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{first}
		for i := 2; i <= n; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i, port))
			if errors.Is(err, syscall.EADDRNOTAVAIL) {
				for _, ln := range lns {
					ln.Close()
				}
				tb.Skipf("this system has no loopback address 127.0.0.%d: %v", i, err)
			}
			if err != nil {
				break // the port is taken there: try another
			}
			lns = append(lns, ln)
		}
		if len(lns) == n {
			return lns
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	tb.Fatal("found no port free at every loopback address")
	return nil
}

// nameServer is a DNS server on 127.0.0.1:0 (UDP) that answers every A
// question with the addresses it was given last, as a cluster's DNS
// answers for a headless Service with its ready pods' addresses, and every
// other question with no records.
type nameServer struct {
	pc   net.PacketConn
	mu   sync.Mutex
	ips  []netip.Addr
	done chan struct{}
}

func startNameServer(tb testing.TB, ips ...netip.Addr) *nameServer {
	tb.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ns := &nameServer{pc: pc, ips: ips, done: make(chan struct{})}
	go ns.serve()
	tb.Cleanup(func() {
		pc.Close()
		<-ns.done
	})
	return ns
}

func (ns *nameServer) addr() string { return ns.pc.LocalAddr().String() }

// Set replaces the addresses the name resolves to.
func (ns *nameServer) Set(ips ...netip.Addr) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.ips = ips
}

func (ns *nameServer) serve() {
	defer close(ns.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := ns.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, err := ns.answer(buf[:n]); err == nil {
			ns.pc.WriteTo(resp, from)
		}
	}
}

func (ns *nameServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if q.Type == dnsmessage.TypeA {
		ns.mu.Lock()
		ips := ns.ips
		ns.mu.Unlock()
		for _, ip := range ips {
			if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET}, dnsmessage.AResource{A: ip.As4()}); err != nil {
				return nil, err
			}
		}
	}
	return b.Finish()
}

// callLog is which replica each CreateMultiCardPayment reached, in order.
type callLog struct {
	mu  sync.Mutex
	ips []netip.Addr
}

func newCallLog() *callLog { return &callLog{} }

// record is a client interceptor that logs the replica of each payment
// that succeeded.
func (l *callLog) record(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if err != nil || method != paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
		return err
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		l.mu.Lock()
		l.ips = append(l.ips, a.AddrPort().Addr().Unmap())
		l.mu.Unlock()
	}
	return nil
}

func (l *callLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ips)
}

func (l *callLog) counts() map[netip.Addr]int { return l.countsSince(0) }

// countsSince counts calls by replica from the i-th on.
func (l *callLog) countsSince(i int) map[netip.Addr]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[netip.Addr]int{}
	for _, ip := range l.ips[i:] {
		n[ip]++
	}
	return n
}
