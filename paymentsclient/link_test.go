package paymentsclient_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// link is a TCP proxy on 127.0.0.1:0 in front of paymentsd: the network
// between a caller and paymentsd. Bytes pass both ways until Hold; from
// then on, what callers send towards paymentsd is held (answers still pass
// back), as by a congested link or a middlebox that sits on a request.
// Release delivers the held bytes in order, each as long after the first
// as it was sent after it, so a request and the cancellation that followed
// it arrive as far apart as they left. Bytes never released are dropped
// when the test ends.
type link struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	holding  bool
	released chan struct{} // closed by Release
	at       time.Time     // when Release was called
	first    time.Time     // when the first held bytes were read
	held     chan struct{} // closed when the first bytes are held
	conns    []net.Conn

	wg   sync.WaitGroup
	done chan struct{}
}

func startLink(t *testing.T, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln, target: target, released: make(chan struct{}), held: make(chan struct{}), done: make(chan struct{})}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(l.close)
	return l
}

func (l *link) addr() string { return l.ln.Addr().String() }

// Hold holds, from now on, every byte a caller sends until Release.
func (l *link) Hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holding = true
}

// Held is closed once the link holds a caller's bytes.
func (l *link) Held() <-chan struct{} { return l.held }

// Release delivers the held bytes, and lets later ones pass.
func (l *link) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.holding {
		return
	}
	l.holding = false
	l.at = time.Now()
	close(l.released)
}

func (l *link) close() {
	close(l.done)
	l.ln.Close()
	l.mu.Lock()
	for _, c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *link) accept() {
	defer l.wg.Done()
	for {
		down, err := l.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", l.target)
		if err != nil {
			down.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, down, up)
		l.mu.Unlock()
		l.wg.Add(2)
		go func() {
			defer l.wg.Done()
			io.Copy(down, up) // answers pass
			down.Close()
		}()
		go func() {
			defer l.wg.Done()
			l.forward(up, down)
			up.Close()
		}()
	}
}

// chunk is what one read from a caller returned, and when.
type chunk struct {
	b    []byte
	at   time.Time
	held bool
}

// forward copies what the caller sends to paymentsd, holding it while the
// link holds.
func (l *link) forward(up, down net.Conn) {
	chunks := make(chan chunk, 1024)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := down.Read(buf)
			if n > 0 {
				c := chunk{b: buf[:n], at: time.Now()}
				l.mu.Lock()
				if l.holding {
					c.held = true
					if l.first.IsZero() {
						l.first = c.at
						close(l.held)
					}
				}
				l.mu.Unlock()
				select {
				case chunks <- c:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if c.held {
			select {
			case <-l.released:
			case <-l.done:
				return
			}
			// Replay the link's delay: as long after the release as the
			// bytes were read after the first held ones.
			l.mu.Lock()
			due := l.at.Add(c.at.Sub(l.first))
			l.mu.Unlock()
			t := time.NewTimer(time.Until(due))
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
		}
		if _, err := up.Write(c.b); err != nil {
			return
		}
	}
}

// dialLink returns a client connection to paymentsd through l, connected
// (and so past the HTTP/2 handshake) before it returns.
func dialLink(t *testing.T, l *link, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(l.addr(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := paymentsv1.NewPaymentsServiceClient(conn).GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "warm-up"}, grpc.WaitForReady(true)); status.Code(err) != codes.NotFound {
		t.Fatalf("warm-up lookup through the link = %v, want NotFound", err)
	}
	return conn
}

// routes is two paths to one paymentsd, as a caller balancing over two
// replicas has: the first CreateMultiCardPayment goes over slow, every
// other call over fast.
type routes struct {
	slow, fast *grpc.ClientConn
	mu         sync.Mutex
	used       bool
}

func (r *routes) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	conn := r.fast
	if method == paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
		r.mu.Lock()
		if !r.used {
			r.used, conn = true, r.slow
		}
		r.mu.Unlock()
	}
	return conn.Invoke(ctx, method, args, reply, opts...)
}

func (r *routes) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return r.fast.NewStream(ctx, desc, method, opts...)
}
