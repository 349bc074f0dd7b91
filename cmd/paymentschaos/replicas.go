package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/proc"
)

// replica is one paymentsd replica: a process that a fault may kill and
// the run then starts again, on the same addresses (as a Kubernetes
// Service keeps its address while its pod restarts), so that callers'
// connections find it again.
type replica struct {
	name    string // its listener's name at the provider: r0, r1, …
	bin     string
	env     []string
	logPath string
	pki     *pki

	mu       sync.Mutex
	p        *proc.Process // nil while it is down
	grpcAddr string
	httpAddr string
	starts   int
	// conn and client call as the callers' identity; admin as the
	// person's, who may list and resolve, and read any record.
	conn      *grpc.ClientConn
	client    paymentsv1.PaymentsServiceClient
	adminConn *grpc.ClientConn
	admin     paymentsv1.PaymentsServiceClient
}

// start starts the replica: on free ports the first time, on the same
// ones after.
func (r *replica) start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	grpcAddr, httpAddr := r.grpcAddr, r.httpAddr
	if grpcAddr == "" {
		grpcAddr, httpAddr = "127.0.0.1:0", "127.0.0.1:0"
	}
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	r.starts++
	fmt.Fprintf(logf, "{\"msg\":\"paymentschaos: start %d of %s\",\"time\":%q}\n", r.starts, r.name, time.Now().UTC().Format(time.RFC3339Nano))
	env := append([]string{"PAYMENTS_GRPC_ADDR=" + grpcAddr, "PAYMENTS_HTTP_ADDR=" + httpAddr}, r.env...)
	p, ready, err := proc.Start(ctx, proc.Command{Name: "paymentsd " + r.name, Path: r.bin, Env: env, Log: logf})
	if err != nil {
		logf.Close()
		return err
	}
	go func() {
		<-p.Exited()
		logf.Close()
	}()
	r.p = p
	if r.grpcAddr == "" {
		r.grpcAddr, r.httpAddr = ready.GRPCAddr, ready.HTTPAddr
		// Reconnect soon after a restart: gRPC's default backoff grows
		// to two minutes.
		bc := backoff.DefaultConfig
		bc.MaxDelay = time.Second
		dial := func(cert tls.Certificate) (*grpc.ClientConn, error) {
			return grpc.NewClient(r.grpcAddr,
				grpc.WithTransportCredentials(credentials.NewTLS(r.pki.clientTLS(cert))),
				grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 2 * time.Second}))
		}
		if r.conn, err = dial(r.pki.caller); err != nil {
			return err
		}
		if r.adminConn, err = dial(r.pki.admin); err != nil {
			return err
		}
		r.client = paymentsv1.NewPaymentsServiceClient(r.conn)
		r.admin = paymentsv1.NewPaymentsServiceClient(r.adminConn)
	}
	return nil
}

// httpURL is the base URL of the replica's REST port.
func (r *replica) httpURL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return "https://" + r.httpAddr
}

// kill SIGKILLs the replica and waits for it to exit.
func (r *replica) kill() {
	r.mu.Lock()
	p := r.p
	r.p = nil
	r.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// terminate sends the replica SIGTERM, as Kubernetes does to a pod it
// stops, and waits for it to drain and exit; if it has not exited after
// grace it is SIGKILLed. It reports whether it was.
func (r *replica) terminate(grace time.Duration) (killed bool) {
	r.mu.Lock()
	p := r.p
	r.p = nil
	r.mu.Unlock()
	if p == nil {
		return false
	}
	p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Exited():
		return false
	case <-t.C:
		p.Kill()
		return true
	}
}

// stop stops the replica gracefully (SIGTERM: it drains).
func (r *replica) stop() {
	r.mu.Lock()
	p := r.p
	r.p = nil
	r.mu.Unlock()
	if p != nil {
		p.Stop()
	}
}

func (r *replica) close() {
	r.stop()
	if r.conn != nil {
		r.conn.Close()
		r.adminConn.Close()
	}
}

// running reports whether the replica's process is up.
func (r *replica) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p != nil && r.p.CheckRunning() == nil
}

// exitedOnItsOwn reports a replica that died without a fault's kill.
func (r *replica) exitedOnItsOwn() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return nil
	}
	return r.p.CheckRunning()
}

// logTally counts the warnings and errors paymentsd logged, by message.
type logTally map[string]int

// tallyLogs reads the replicas' logs.
func tallyLogs(replicas []*replica) logTally {
	t := make(logTally)
	for _, r := range replicas {
		f, err := os.Open(r.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Level string `json:"level"`
				Msg   string `json:"msg"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && (line.Level == "WARN" || line.Level == "ERROR") {
				t[line.Level+" "+line.Msg]++
			}
		}
		f.Close()
	}
	return t
}

// sorted lists the tally's entries, most frequent first.
func (t logTally) sorted() []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if t[keys[i]] != t[keys[j]] {
			return t[keys[i]] > t[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

func newReplicas(n int, bin, dir string, certs *pki, env func(name string) []string) []*replica {
	var rs []*replica
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		rs = append(rs, &replica{name: name, bin: bin, env: append(env(name), certs.env()...), pki: certs, logPath: filepath.Join(dir, "paymentsd-"+name+".log")})
	}
	return rs
}
