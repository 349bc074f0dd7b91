package storetest

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// RoundTrips is a TCP proxy in front of a PostgreSQL server (or a pooler)
// that counts the round trips its clients make: every request the client
// then waits on, which in PostgreSQL's protocol ends with a Sync (the
// extended protocol: Parse, Bind, Execute… Sync) or is a simple Query
// (BEGIN, COMMIT, ROLLBACK and pings, which pgx sends that way). It reads
// what the client sends and changes nothing: a connection through it is the
// connection it stands in front of.
type RoundTrips struct {
	t      testing.TB
	ln     net.Listener
	target string

	requests, pings, conns atomic.Int64

	mu    sync.Mutex
	open  map[net.Conn]struct{}
	wg    sync.WaitGroup
	close sync.Once
}

// CountRoundTrips starts a RoundTrips proxy in front of the server that
// dbURL names, and returns it with dbURL through it. t.Cleanup stops it.
func CountRoundTrips(t testing.TB, dbURL string) (*RoundTrips, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal("the database URL is not a URL")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	r := &RoundTrips{t: t, ln: ln, target: target, open: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
	u.Host = ln.Addr().String()
	return r, u.String()
}

// Requests is how many requests (round trips) clients have made through
// the proxy since it started, pings (Pings) left out, and connection
// set-up (authentication) too.
func (r *RoundTrips) Requests() int64 { return r.requests.Load() }

// Pings is how many of the clients' simple queries were pgx's pings
// ("-- ping"), which database/sql's pool sends before it reuses a
// connection that has been idle for more than a second.
func (r *RoundTrips) Pings() int64 { return r.pings.Load() }

// Conns is how many connections clients have opened through the proxy.
func (r *RoundTrips) Conns() int64 { return r.conns.Load() }

// Close stops the proxy and closes every connection through it.
func (r *RoundTrips) Close() {
	r.close.Do(func() {
		r.ln.Close()
		r.mu.Lock()
		for c := range r.open {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
}

func (r *RoundTrips) track(c net.Conn) {
	r.mu.Lock()
	r.open[c] = struct{}{}
	r.mu.Unlock()
}

func (r *RoundTrips) accept() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", r.target)
		if err != nil {
			client.Close()
			continue
		}
		r.conns.Add(1)
		r.track(client)
		r.track(server)
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			io.Copy(client, server)
			client.Close()
		}()
		go func() {
			defer r.wg.Done()
			p := &protocolCounter{r: r}
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					p.feed(buf[:n])
					if _, werr := server.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			server.Close()
		}()
	}
}

// protocolCounter follows the messages a client sends, as they arrive in
// pieces.
type protocolCounter struct {
	r *RoundTrips
	// started: the startup message has gone, and every message from now on
	// has a type byte.
	started bool
	// head holds a message's header as it arrives: its type byte (once
	// started) and its length.
	head []byte
	// typ is the message being read, rest how many of its bytes are still
	// to come, and body its first bytes (for a Query, to tell pings).
	typ  byte
	rest int
	body []byte
}

const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
)

var pingQuery = []byte("-- ping")

func (p *protocolCounter) feed(b []byte) {
	for len(b) > 0 {
		if p.rest > 0 {
			n := min(p.rest, len(b))
			if keep := p.keep(); len(p.body) < keep {
				p.body = append(p.body, b[:min(n, keep-len(p.body))]...)
			}
			p.rest -= n
			b = b[n:]
			if p.rest == 0 {
				p.end()
			}
			continue
		}
		headLen := 4
		if p.started {
			headLen = 5
		}
		n := min(headLen-len(p.head), len(b))
		p.head = append(p.head, b[:n]...)
		b = b[n:]
		if len(p.head) < headLen {
			continue
		}
		if p.started {
			p.typ = p.head[0]
			p.rest = int(binary.BigEndian.Uint32(p.head[1:])) - 4
		} else {
			// An untyped message: SSLRequest or GSSENCRequest (answered
			// with one byte, and followed by another untyped message), or
			// the startup message, after which every message is typed.
			// Its code is its first four bytes, kept as its body.
			p.typ = 's'
			p.rest = int(binary.BigEndian.Uint32(p.head)) - 4
		}
		p.head = p.head[:0]
		p.body = p.body[:0]
		if p.rest == 0 {
			p.end()
		}
	}
}

// keep is how many of the message's first bytes end needs.
func (p *protocolCounter) keep() int {
	switch p.typ {
	case 's':
		return 4
	case 'Q':
		return len(pingQuery)
	}
	return 0
}

// end counts the message just read.
func (p *protocolCounter) end() {
	switch p.typ {
	case 's':
		code := uint32(0)
		if len(p.body) == 4 {
			code = binary.BigEndian.Uint32(p.body)
		}
		if code != sslRequest && code != gssEncRequest {
			p.started = true
		}
	case 'S':
		p.r.requests.Add(1)
	case 'Q':
		if bytes.Equal(p.body, pingQuery) {
			p.r.pings.Add(1)
		} else {
			p.r.requests.Add(1)
		}
	}
}
