package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoServer is StartServer's error when PostgreSQL's server binaries
// are not installed (as `bash .ci/postgres` installs them).
var ErrNoServer = errors.New("PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin)")

// ServerBin is the bin directory of the newest PostgreSQL installed, or
// ErrNoServer.
func ServerBin() (string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		return "", ErrNoServer
	}
	sort.Strings(bins)
	return filepath.Dir(bins[len(bins)-1]), nil
}

// Server is a PostgreSQL server of one's own on a loopback port, which its
// owner may stop, kill, freeze and start again, as a failing database
// would.
type Server struct {
	bin      string
	dir      string
	port     int
	maxConns int
	asPG     []string // the command prefix that runs as the postgres user
	log      io.Writer
	// URL is the server's postgres database, for the postgres superuser.
	URL string
}

// ServerOptions are StartServer's.
type ServerOptions struct {
	MaxConnections int       // the server's max_connections; 100 if 0
	Log            io.Writer // where initdb's and pg_ctl's output goes; nil drops it
}

// StartServer initdbs a cluster in dir (created if need be) and starts it
// on a free loopback port, trusting local connections. As root, the
// server runs as the postgres user, as PostgreSQL requires, and dir is
// given to that user.
func StartServer(ctx context.Context, dir string, opts ServerOptions) (*Server, error) {
	bin, err := ServerBin()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, maxConns: opts.MaxConnections, log: opts.Log}
	if s.maxConns == 0 {
		s.maxConns = 100
	}
	if s.log == nil {
		s.log = io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	cred, err := postgresUser()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
		s.asPG = []string{"runuser", "-u", "postgres", "--"}
	}
	if err := s.run(ctx, "initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Port is the server's loopback port.
func (s *Server) Port() int { return s.port }

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// Start starts the server, which must be stopped, and waits until it
// accepts connections.
func (s *Server) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=%d", s.port, s.dir, s.maxConns)
	return s.run(ctx, "pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "postgres.log"), "-w", "-t", "60", "-o", opts, "start")
}

// Stop stops the server with pg_ctl's shutdown mode: "fast" (roll back
// open transactions, close connections) or "immediate" (abort, as a crash
// would; the next start recovers from the WAL).
func (s *Server) Stop(ctx context.Context, mode string) error {
	return s.run(ctx, "pg_ctl", "-D", s.data(), "-w", "-t", "60", "-m", mode, "stop")
}

// Close stops the server, whatever its state, as Stop "immediate" does,
// and reports nothing.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.run(ctx, "pg_ctl", "-D", s.data(), "-w", "-m", "immediate", "stop")
}

// ServerLog is what the server has logged (postgres.log).
func (s *Server) ServerLog() []byte {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	return b
}

// Postmaster is the server's postmaster's process ID.
func (s *Server) Postmaster() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.data(), "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read the postmaster's pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid holds %q", first)
	}
	return pid, nil
}

// KillPostmaster SIGKILLs the postmaster alone, as a crash or the OOM
// killer would. Its backends notice and exit on their own.
func (s *Server) KillPostmaster() error {
	pid, err := s.Postmaster()
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// Kill SIGKILLs the postmaster and every process it started, as a crash
// of the machine would, and waits until they are gone (for 30 s at most).
// Start starts it again, recovering from the WAL.
func (s *Server) Kill() error {
	pid, err := s.Postmaster()
	if err != nil {
		return fmt.Errorf("kill the server: %w", err)
	}
	// Its children each lead a process group of their own: find them
	// before the postmaster dies and they are handed to init.
	pids := append([]int{pid}, childrenOf(pid)...)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pids {
		for syscall.Kill(p, 0) == nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d of the killed server is still there", p)
			}
			time.Sleep(10 * time.Millisecond) // no signal for another process's end
		}
	}
	return nil
}

// Freeze stops the server with SIGSTOP, the postmaster and every process
// it started: a hung server, whose connections stay open and whose
// statements and commits neither finish nor fail. It returns thaw, which
// sends them SIGCONT (once, however often it is called). Each backend and
// auxiliary process of PostgreSQL calls setsid(), so a signal to the
// postmaster's process group would not reach them; stopped first, the
// postmaster forks no process the list misses.
func (s *Server) Freeze() (thaw func(), err error) {
	pm, err := s.Postmaster()
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("freeze the postmaster: %w", err)
	}
	pids := append([]int{pm}, childrenOf(pm)...)
	for _, pid := range pids[1:] {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGCONT)
			}
		})
	}, nil
}

// ReadOnly turns the server read-only (on) or writable again (off), for
// every session, as default_transaction_read_only set in its
// configuration and reloaded: transactions that begin after it refuse
// writes (SQLSTATE 25006) until it is turned off.
func (s *Server) ReadOnly(ctx context.Context, on bool) error {
	db, err := sql.Open("pgx", s.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stmt := "ALTER SYSTEM RESET default_transaction_read_only"
	if on {
		stmt = "ALTER SYSTEM SET default_transaction_read_only = on"
	}
	for _, q := range []string{"SET default_transaction_read_only = off", stmt, "SELECT pg_reload_conf()"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("read-only %v: %s: %w", on, q, err)
		}
	}
	return nil
}

// run runs one of PostgreSQL's programs, as the postgres user if need be;
// its output goes to the log, and into the error if it fails.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	argv := append(append(append([]string(nil), s.asPG...), filepath.Join(s.bin, name)), args...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = s.dir // the postgres user may not enter the working directory
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s.log.Write(out.Bytes())
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
