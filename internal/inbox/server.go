package inbox

import (
	"container/list"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Timeouts of the webhook port. A connection that has not shown a token is
// closed after its first answer, so the header timeout is all a stranger
// can hold one for; the idle timeout applies only to a sender that
// delivered with the token.
const (
	ReadHeaderTimeout = 3 * time.Second
	// ReadTimeout bounds a request, header and body: a body of
	// LargestMaxBytes at 35 KB/s.
	ReadTimeout  = 30 * time.Second
	WriteTimeout = 30 * time.Second
	IdleTimeout  = 15 * time.Second
	// MaxHeaderBytes bounds the request line and header together.
	MaxHeaderBytes = 8 << 10
)

// DefaultMaxConnectionsPerIP is the default bound on the webhook port's
// connections from one address. Behind an Ingress every connection comes
// from the controller's pods, but those finish reading a request before
// they open a connection for it, so their connections are the requests in
// flight, which the deliveries' byte budget answers quickly past 16.
const DefaultMaxConnectionsPerIP = 64

// ConnLimits bound the webhook port's connections.
type ConnLimits struct {
	// Max is the most connections open at once. When it is reached, a new
	// connection takes the place of one that has not shown a token: the
	// oldest from the address with the most such connections, so a flood
	// from a few addresses evicts its own. Only when every connection has
	// shown a token is the new one closed.
	Max int
	// PerIP, if set, is the most connections open at once from one remote
	// address; more are closed as they are accepted.
	PerIP int
}

// Server is the webhook port's HTTP server.
type Server struct {
	// HTTP serves the handler; serve it on Listener(ln).
	HTTP  *http.Server
	guard *guard
}

// NewServer returns the server for h with the bounds an internet-facing
// listener needs: small headers, short deadlines on reading them, on
// reading the body and on idle connections, connections that showed no
// token closed after one answer, and limits on connections.
func NewServer(h *Handler, limits ConnLimits, errorLog *slog.Logger) *Server {
	g := &guard{limits: limits, metrics: h.metrics, perIP: map[string]int{}, untrusted: map[string]*list.List{}}
	return &Server{guard: g, HTTP: &http.Server{
		Handler: h,
		// net/http allows MaxHeaderBytes plus 4096.
		MaxHeaderBytes:    MaxHeaderBytes - 4096,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		// net/http would answer "OPTIONS *" itself, 200 with keep-alive:
		// a stranger could hold a connection with one every few seconds.
		// The handler answers it as any unknown target, and closes.
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			if gc, ok := c.(*guardedConn); ok {
				return context.WithValue(ctx, connKey{}, gc)
			}
			return ctx
		},
		// net/http's own messages (TLS handshakes, bad requests) name no
		// path.
		ErrorLog: slog.NewLogLogger(errorLog.Handler(), slog.LevelWarn),
	}}
}

// Listener returns ln bounded by the server's ConnLimits.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &guardedListener{Listener: ln, g: s.guard}
}

type connKey struct{}

// trust marks the connection serving ctx as one that showed a configured
// token: it is kept alive, and never evicted.
func trust(ctx context.Context) {
	if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
		c.g.trust(c)
	}
}

// trusted reports whether the connection serving ctx has shown a token.
func trusted(ctx context.Context) bool {
	c, ok := ctx.Value(connKey{}).(*guardedConn)
	if !ok {
		return false
	}
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return c.trusted
}

// Reasons a connection is dropped, the values of the reason label.
const (
	dropPerIP   = "per_ip"
	dropFull    = "full"
	dropEvicted = "evicted"
)

// guard counts the port's connections, by address, and keeps those that
// have shown no token by address in the order they came, to evict.
type guard struct {
	limits  ConnLimits
	metrics *Metrics

	mu        sync.Mutex
	open      int
	perIP     map[string]int
	untrusted map[string]*list.List // by address, of *guardedConn, oldest first
	accepted  uint64                // connections accepted, to order them
}

type guardedListener struct {
	net.Listener
	g *guard
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// admit returns c guarded, or nil having closed it.
func (g *guard) admit(c net.Conn) *guardedConn {
	ip := remoteIP(c)
	g.mu.Lock()
	if g.limits.PerIP > 0 && g.perIP[ip] >= g.limits.PerIP {
		g.mu.Unlock()
		c.Close()
		g.metrics.drop(dropPerIP)
		return nil
	}
	var victim *guardedConn
	if g.limits.Max > 0 && g.open >= g.limits.Max {
		if victim = g.victim(); victim == nil {
			g.mu.Unlock()
			c.Close()
			g.metrics.drop(dropFull)
			return nil
		}
		g.forget(victim)
	}
	g.accepted++
	gc := &guardedConn{Conn: c, g: g, ip: ip, seq: g.accepted}
	g.open++
	g.perIP[ip]++
	l := g.untrusted[ip]
	if l == nil {
		l = list.New()
		g.untrusted[ip] = l
	}
	gc.elem = l.PushBack(gc)
	g.mu.Unlock()
	if victim != nil {
		victim.Close()
		g.metrics.drop(dropEvicted)
	}
	return gc
}

// victim returns the connection to evict: of the addresses with the most
// connections that showed no token, the oldest such connection. A sender
// with a connection or two is evicted only by a flood from as many
// addresses as the port holds connections.
func (g *guard) victim() *guardedConn {
	var victim *guardedConn
	most := 0
	for _, l := range g.untrusted {
		front := l.Front().Value.(*guardedConn)
		if l.Len() > most || l.Len() == most && front.seq < victim.seq {
			victim, most = front, l.Len()
		}
	}
	return victim
}

// forget takes c out of the connections that may be evicted.
func (g *guard) forget(c *guardedConn) {
	if c.elem == nil {
		return
	}
	l := g.untrusted[c.ip]
	l.Remove(c.elem)
	c.elem = nil
	if l.Len() == 0 {
		delete(g.untrusted, c.ip)
	}
}

func (g *guard) trust(c *guardedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c.trusted = true
	g.forget(c)
}

func (g *guard) release(c *guardedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if g.perIP[c.ip]--; g.perIP[c.ip] <= 0 {
		delete(g.perIP, c.ip)
	}
	g.forget(c)
}

// remoteIP is c's remote address without its port.
func remoteIP(c net.Conn) string {
	addr := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

type guardedConn struct {
	net.Conn
	g    *guard
	ip   string
	seq  uint64 // order of acceptance
	once sync.Once
	// trusted and elem belong to g.mu.
	trusted bool
	elem    *list.Element
}

func (c *guardedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.g.release(c) })
	return err
}

func (m *Metrics) drop(reason string) {
	if m != nil {
		m.dropped.WithLabelValues(reason).Inc()
	}
}
