package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// connGuard bounds the connections of a port whose clients each make a
// small request on a connection of their own (the health port's probes,
// the metrics port's scrapes), without ever turning one away: when the
// port is full, a new connection takes the place of one with no request in
// progress, the one idle longest of the address holding the most idle
// connections, or, if every connection has a request in progress, the
// oldest. Connections held open (idle, a preface or a header that never
// ends, a byte at a time) can then only delay a probe by being opened
// faster than the port holds connections within the probe's own few
// milliseconds; turned away instead, as past a plain cap, 16 held
// connections would have failed every probe, and the liveness probe would
// have restarted the pod. (The kubelet opens a connection for each probe,
// and Prometheus' scrape reconnects if its idle one was taken.)
type connGuard struct {
	max     int
	evicted prometheus.Counter

	mu    sync.Mutex
	conns map[*guardedConn]bool
	seq   uint64 // orders acceptance and idleness
}

// newEvictedConnections registers paymentsd_connections_evicted_total.
func newEvictedConnections(reg prometheus.Registerer) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paymentsd_connections_evicted_total",
		Help: "Connections to the health or metrics port (port) closed to make room for a new one: the port was full. Probes and scrapes each open a connection; many evictions mean something holds connections open.",
	}, []string{"port"})
	reg.MustRegister(v)
	for _, p := range []string{"health", "metrics"} {
		v.WithLabelValues(p)
	}
	return v
}

func newConnGuard(max int, evicted prometheus.Counter) *connGuard {
	return &connGuard{max: max, evicted: evicted, conns: map[*guardedConn]bool{}}
}

// guardedConn is a connection the guard counts. inFlight and idleSince
// belong to g.mu.
type guardedConn struct {
	net.Conn
	g         *connGuard
	ip        string
	seq       uint64
	inFlight  int
	idleSince uint64
	once      sync.Once
}

func (c *guardedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return err
}

// listener returns ln, bounded by the guard.
func (g *connGuard) listener(ln net.Listener) net.Listener {
	return &guardedListener{Listener: ln, g: g}
}

type guardedListener struct {
	net.Listener
	g *connGuard
}

func (l *guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.g.admit(c), nil
}

// admit counts c, first closing the victim if the port is full.
func (g *connGuard) admit(c net.Conn) *guardedConn {
	ip := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(ip); err == nil {
		ip = host
	}
	g.mu.Lock()
	var victim *guardedConn
	if len(g.conns) >= g.max {
		victim = g.victim()
		delete(g.conns, victim)
	}
	g.seq++
	gc := &guardedConn{Conn: c, g: g, ip: ip, seq: g.seq, idleSince: g.seq}
	g.conns[gc] = true
	g.mu.Unlock()
	if victim != nil {
		victim.Close()
		if g.evicted != nil {
			g.evicted.Inc()
		}
	}
	return gc
}

// victim is the connection to close for a new one; the guard holds at
// least one.
func (g *connGuard) victim() *guardedConn {
	idleByIP := map[string]int{}
	for c := range g.conns {
		if c.inFlight == 0 {
			idleByIP[c.ip]++
		}
	}
	// before reports whether c goes before v.
	before := func(c, v *guardedConn) bool {
		switch {
		case (c.inFlight == 0) != (v.inFlight == 0):
			return c.inFlight == 0
		case c.inFlight > 0:
			return c.seq < v.seq
		case idleByIP[c.ip] != idleByIP[v.ip]:
			return idleByIP[c.ip] > idleByIP[v.ip]
		}
		return c.idleSince < v.idleSince
	}
	var victim *guardedConn
	for c := range g.conns {
		if victim == nil || before(c, victim) {
			victim = c
		}
	}
	return victim
}

type guardedConnKey struct{}

// connContext is the http.Server's ConnContext: it lets track find the
// connection a request came on.
func (g *connGuard) connContext(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*guardedConn); ok {
		return context.WithValue(ctx, guardedConnKey{}, gc)
	}
	return ctx
}

// track marks the request's connection busy while next serves it.
func (g *connGuard) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gc, ok := r.Context().Value(guardedConnKey{}).(*guardedConn)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		g.mu.Lock()
		gc.inFlight++
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			if gc.inFlight--; gc.inFlight == 0 {
				g.seq++
				gc.idleSince = g.seq
			}
			g.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// sidePort is one of the side ports (health, metrics, webhooks): its
// listener and server, or nothing when its address is unset.
type sidePort struct {
	srv *http.Server
	ln  net.Listener
	tls bool // serves TLS with srv.TLSConfig
}

// listenGuarded binds addr (the value of the variable env) for srv, which
// serves h behind a connGuard of max connections; evicted counts the
// connections closed to make room for new ones. An empty addr is a port
// that serves nothing.
func listenGuarded(env, addr string, max int, evicted prometheus.Counter, h http.Handler, srv *http.Server) (*sidePort, error) {
	if addr == "" {
		return &sidePort{}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	guard := newConnGuard(max, evicted)
	srv.Handler, srv.ConnContext = guard.track(h), guard.connContext
	return &sidePort{srv: srv, ln: guard.listener(ln)}, nil
}

// serve serves until shutdown; it returns at once without a listener.
func (p *sidePort) serve(errc chan<- error) {
	if p.srv == nil {
		return
	}
	go func() {
		if p.tls {
			errc <- p.srv.ServeTLS(p.ln, "", "")
			return
		}
		errc <- p.srv.Serve(p.ln)
	}()
}

// addr is the bound address, or "" without a listener.
func (p *sidePort) addr() string {
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// shutdown stops the listener and waits, until ctx ends, for the requests
// in progress; past ctx it closes their connections.
func (p *sidePort) shutdown(ctx context.Context) error {
	if p.srv == nil {
		return nil
	}
	err := p.srv.Shutdown(ctx)
	if err != nil {
		p.srv.Close()
	}
	return err
}

// close closes the listener of a port that never served.
func (p *sidePort) close() {
	if p.ln != nil {
		p.ln.Close()
	}
}
