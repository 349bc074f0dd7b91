package service

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// Limits that hold against hostile or careless callers. Each is sized so a
// pod with a 256 MiB memory limit survives every connection and call slot
// being used at once; docs/security.md ("Limits") gives the arithmetic.
const (
	// DefaultMaxInFlight is the default cap on calls in progress, gRPC
	// streams (counted from their headers, before any message) and REST
	// requests (counted from their headers, before the body) together;
	// WatchProviderEvents streams have MaxWatchStreams instead. The
	// benchmark measured 168 MiB peak RSS with 2,000 payments in flight.
	DefaultMaxInFlight = 1000
	// DefaultMaxConnections is the default cap on open connections per
	// port; connections over it are closed as soon as they are accepted.
	DefaultMaxConnections = 500
	// MaxConcurrentStreams is the most gRPC streams one HTTP/2 connection
	// may have open (grpc-go's default is unlimited); more are refused with
	// RST_STREAM REFUSED_STREAM.
	MaxConcurrentStreams = 100
	// MaxHeaderBytes bounds a request's header: the gRPC header list
	// (grpc-go's default is 16 MiB) and the REST request line and header
	// (net/http's default is 1 MiB, plus its 4 KiB allowance).
	MaxHeaderBytes = 16 << 10
	// DefaultReadTimeout bounds reading a REST request's header and then its
	// body.
	DefaultReadTimeout = 10 * time.Second
	// IdleTimeout closes a REST keep-alive connection with no request.
	IdleTimeout = 2 * time.Minute
	// MaxWatchStreams caps WatchProviderEvents streams open at once. A
	// watch lasts as long as its caller wants, so watches have slots of
	// their own and never take one from payments; a watch over the cap is
	// refused with RESOURCE_EXHAUSTED.
	MaxWatchStreams = 64
)

// MaxConnectionAge is how long a gRPC connection lives before paymentsd
// closes it gracefully (GOAWAY; grpc-go adds ±10% jitter), so that
// long-lived callers spread over replicas the autoscaler adds. A gRPC
// client looks its target's name up again whenever a connection closes,
// but at most every 30 s (grpc-go's dns resolver). At 20 s (22 s at most)
// every 30 s holds a close, so a client balancing round_robin over the
// headless Service (paymentsclient.DialOptions) looks the name up every
// 30 s, and finds a new replica within 30 s of the cluster DNS answering
// with it (docs/client.md, "Spreading calls over replicas"). A client of
// the ClusterIP Service reconnects as often, through kube-proxy, to a
// replica picked at random. A shorter age would reconnect more often
// without finding replicas sooner; one over 27 s would leave gaps between
// lookups. The cost is a reconnection (with mTLS, a TLS handshake) per
// client and replica every 20 s.
const MaxConnectionAge = 20 * time.Second

// ConnAge closes REST connections gracefully once they are older than
// MaxConnectionAge, as the gRPC port does its own: the answer to the first
// request past that age says Connection: close over HTTP/1.1, and over
// HTTP/2 net/http follows it with GOAWAY, so the caller's next request
// opens a new connection. A REST connection in use would otherwise stay
// open for as long as it is used: its caller would go on presenting the
// certificate it connected with until that expired (and be refused, see
// Options.StillTrusted) rather than the one renewed since, and would never
// reach replicas the autoscaler adds. Set ConnContext as the http.Server's
// and wrap its handler in Handler.
type ConnAge struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

type connOpenedKey struct{}

func (a ConnAge) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// ConnContext notes when the connection was accepted.
func (a ConnAge) ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connOpenedKey{}, a.now())
}

// Handler makes the answer to a request on a connection older than
// MaxConnectionAge that connection's last.
func (a ConnAge) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if opened, ok := r.Context().Value(connOpenedKey{}).(time.Time); ok && a.now().Sub(opened) > MaxConnectionAge {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// MaxConnectionAgeGrace is how long calls in progress may go on after
// MaxConnectionAge before the connection is closed under them. New calls
// go to a new connection at once, so the grace does not hold traffic on
// the old one; it bounds a stream's life (WatchProviderEvents, a List
// whose caller reads slowly) at MaxConnectionAge plus the grace. It is
// well over the longest a unary call waits (PAYMENTS_UPSTREAM_TIMEOUT, 15 s
// by default), and long enough that a watch ends (UNAVAILABLE, and its
// caller watches again from the last sequence it received) about every
// 5 minutes 20 s rather than every minute.
const MaxConnectionAgeGrace = 5 * time.Minute

// grpcKeepalive closes idle and old connections, and pings quiet ones so a
// vanished peer's connection is reclaimed.
var grpcKeepalive = keepalive.ServerParameters{
	MaxConnectionIdle:     5 * time.Minute,
	MaxConnectionAge:      MaxConnectionAge,
	MaxConnectionAgeGrace: MaxConnectionAgeGrace,
	Time:                  time.Minute,
	Timeout:               20 * time.Second,
}

// grpcEnforcement closes a connection (GOAWAY too_many_pings) whose client
// pings more often than every 15s; pings without active calls are allowed
// so clients' ordinary keepalives never trip it.
var grpcEnforcement = keepalive.EnforcementPolicy{
	MinTime:             15 * time.Second,
	PermitWithoutStream: true,
}

// openMethod reports whether a gRPC method stays open to every caller and
// outside the in-flight cap: health checks and server reflection.
func openMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// limiter caps calls in flight across both ports. Watch streams, if set,
// are counted by a limiter of their own instead.
type limiter struct {
	max     int64
	n       atomic.Int64
	watches *limiter
	// env is the environment served, which refusals name.
	env paymentsv1.Environment
	// The refusals made at tap time are built once: a flood of streams
	// meets them thousands of times a second. grpc-go sends a tap error's
	// details (grpc-status-details-bin) along with its code and message.
	errOverloaded, errOverloadedLookup error
}

// newLimiter caps calls in flight at max, and WatchProviderEvents streams
// at MaxWatchStreams, for a server of env.
func newLimiter(max int, env paymentsv1.Environment) *limiter {
	return &limiter{
		max:                 int64(max),
		watches:             &limiter{max: MaxWatchStreams},
		env:                 env,
		errOverloaded:       refusal(env, codes.ResourceExhausted, overloaded, true, time.Second).Err(),
		errOverloadedLookup: refusal(env, codes.ResourceExhausted, overloadedLookup, false, time.Second).Err(),
	}
}

func (l *limiter) acquire() bool {
	if l.n.Add(1) > l.max {
		l.n.Add(-1)
		return false
	}
	return true
}

func (l *limiter) release() { l.n.Add(-1) }

const (
	overloaded       = "paymentsd has too many calls in progress; this call sent nothing: retry after a short delay with the same idempotency key"
	overloadedLookup = "paymentsd has too many calls in progress: retry after a short delay"
	tooManyWatches   = "paymentsd has too many WatchProviderEvents streams open; watch again later, or read with ListProviderEvents"
)

var errTooManyWatches = status.Error(codes.ResourceExhausted, tooManyWatches)

// tap admits a gRPC stream as soon as its headers arrive, before grpc-go
// starts a goroutine for it, so a flood of streams that never send a
// message costs a refusal each, not a goroutine each. The slot is released
// when the stream's context ends, which grpc-go guarantees for every
// stream, however it ends.
func (l *limiter) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if openMethod(info.FullMethodName) {
		return ctx, nil
	}
	slots, refused := l, l.errOverloadedLookup
	switch {
	case info.FullMethodName == paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName:
		refused = l.errOverloaded
	case info.FullMethodName == paymentsv1.ProviderEventsService_WatchProviderEvents_FullMethodName && l.watches != nil:
		slots, refused = l.watches, errTooManyWatches
	}
	if !slots.acquire() {
		return nil, refused
	}
	context.AfterFunc(ctx, slots.release)
	return ctx, nil
}

// limitHTTP answers 429 when the cap is reached. It counts a request from
// its header, so slow bodies count too.
func (l *limiter) limitHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.acquire() {
			msg := overloadedLookup
			if createsPayment(r) {
				msg = overloaded
			}
			refuse(w, r, l.env, http.StatusTooManyRequests, codes.ResourceExhausted, msg, time.Second)
			return
		}
		defer l.release()
		next.ServeHTTP(w, r)
	})
}

// limitOptions are the gRPC server options that bound what one caller can
// make paymentsd hold.
func (l *limiter) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.KeepaliveParams(grpcKeepalive),
		grpc.KeepaliveEnforcementPolicy(grpcEnforcement),
		grpc.InTapHandle(l.tap),
	}
}

// LimitListener returns a listener that accepts at most n connections at
// once from l. A connection over the cap is closed as soon as it is
// accepted, so its caller fails fast (and its client can try another pod)
// instead of waiting unseen in the kernel's backlog.
func LimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, max: int64(n)}
}

type limitListener struct {
	net.Listener
	max int64
	n   atomic.Int64
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.n.Add(1) > l.max {
			l.n.Add(-1)
			c.Close()
			continue
		}
		return &limitConn{Conn: c, release: func() { l.n.Add(-1) }}, nil
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
