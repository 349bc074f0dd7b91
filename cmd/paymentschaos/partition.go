package main

import (
	"net"
	"sync"
)

// cutProxy forwards TCP connections to a server (a replica's to
// PostgreSQL, for replica-partition), and can cut them off: while cut, no
// byte goes either way on any connection, old or new, and nothing is
// closed or reset, as when a network partition drops every packet
// between one replica and the database while the others reach it. Once
// healed, what was held goes through.
type cutProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	healed chan struct{} // nil while not cut; closed when healed
}

// closed is a channel that is always closed.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// newCutProxy listens on a free loopback port and forwards to target.
func newCutProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{ln: ln, target: target}
	go p.serve()
	return p, nil
}

// addr is where the proxy listens.
func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// cut stops every byte, until heal.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.healed == nil {
		p.healed = make(chan struct{})
	}
}

// heal lets what was held go through.
func (p *cutProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.healed != nil {
		close(p.healed)
		p.healed = nil
	}
}

// open returns a channel closed once bytes may pass.
func (p *cutProxy) open() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.healed == nil {
		return closed
	}
	return p.healed
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.heal()
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *cutProxy) handle(c net.Conn) {
	// A connection made while cut waits: its handshake would be dropped.
	<-p.open()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	go p.pipe(s, c)
	p.pipe(c, s)
}

// pipe copies src to dst, holding every write (and the close at the end)
// while the proxy is cut.
func (p *cutProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.open()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	<-p.open()
	dst.Close()
	src.Close()
}
