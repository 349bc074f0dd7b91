package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrNoPgBouncer is StartPgBouncer's error when PgBouncer is not
// installed (Debian's package pgbouncer).
var ErrNoPgBouncer = errors.New("pgbouncer is not installed")

// PgBouncer is a PgBouncer of one's own in transaction mode (pool_mode =
// transaction), in front of a PostgreSQL server: each transaction a client
// runs is lent whichever server connection of the pool is free, so nothing
// a client leaves in a server session (a prepared statement, a SET, an
// advisory lock) is there for its next transaction, and another client may
// find it.
type PgBouncer struct {
	dir  string
	port int
	cred *syscall.Credential // whom PgBouncer runs as, if not this user
	bin  string
	log  *syncBuffer
	// cmd is the running PgBouncer, and exited is closed once it has
	// exited; nil when stopped.
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartPgBouncer starts PgBouncer on a free loopback port, in transaction
// mode, in front of the PostgreSQL server that serverURL names, with a
// pool of poolSize server connections for each database and user, its
// files in dir (which must exist). Every database name is routed to that
// server. It logs in to the server as the URL's user, with its password if
// it has one; clients are trusted. Stop stops it. As root, PgBouncer runs
// as the postgres user: it refuses to run as root.
func StartPgBouncer(dir, serverURL string, poolSize int) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		return nil, ErrNoPgBouncer
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, errors.New("the server URL is not a URL")
	}
	serverPort := u.Port()
	if serverPort == "" {
		serverPort = "5432"
	}
	password, _ := u.User.Password()

	b := &PgBouncer{dir: dir, bin: bin, log: &syncBuffer{}}
	if err := os.Chmod(b.dir, 0o755); err != nil {
		return nil, err
	}
	if b.cred, err = postgresUser(); err != nil {
		return nil, err
	}
	if b.port, err = freePort(); err != nil {
		return nil, err
	}

	quote := func(s string) string { return `"` + s + `"` }
	userlist := quote(u.User.Username()) + " " + quote(password) + "\n"
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 2000
server_login_retry = 1
`, u.Hostname(), serverPort, b.port, filepath.Join(b.dir, "userlist.txt"), poolSize)
	for name, body := range map[string]string{"userlist.txt": userlist, "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(b.dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	if err := b.start(); err != nil {
		return nil, err
	}
	return b, nil
}

// URL returns dbURL, a URL of a database on the server behind b, with b's
// address in place of the server's.
func (b *PgBouncer) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", errors.New("the database URL is not a URL")
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String(), nil
}

// Restart stops PgBouncer, which closes every client's connection and
// every server connection, as a pooler's restart or crash does, and
// starts it again on the same port.
func (b *PgBouncer) Restart() error {
	b.Stop()
	return b.start()
}

func (b *PgBouncer) start() error {
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Stdout, cmd.Stderr = b.log, b.log
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.cmd, b.exited = cmd, exited
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("pgbouncer exited: %v\n%s", cmd.ProcessState, b.log.String())
		case <-time.After(20 * time.Millisecond): // waiting for its listener: there is no other signal
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer does not accept connections on 127.0.0.1:%d\n%s", b.port, b.log.String())
		}
	}
}

// Stop ends PgBouncer at once (SIGTERM: immediate shutdown) and waits for
// it.
func (b *PgBouncer) Stop() {
	if b.cmd == nil {
		return
	}
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.exited
	}
	b.cmd, b.exited = nil, nil
}

// syncBuffer is a bytes.Buffer that a process's output and its owner may
// use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
