package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"example.com/paymentsd/internal/store"
)

// Record stores the replicas can share.
const (
	storePostgres = "postgres" // a PostgreSQL server the run starts and stops itself
	storeSQLite   = "sqlite"   // one SQLite file, shared by the replicas' processes
	storePatroni  = "patroni"  // the two-node Patroni cluster of .ci/pgcluster
)

// pgServer is a PostgreSQL server of the run's own, which faults stop and
// kill, as internal/store/storetest.Cluster is a test's.
type pgServer struct {
	bin  string   // PostgreSQL's bin directory
	dir  string   // data and socket directory
	port int      // on 127.0.0.1
	asPG []string // the command prefix that runs as the postgres user
	log  io.Writer
	url  string
}

// startPostgres initdbs a cluster under dir and starts it on a free
// loopback port, trusting local connections. It needs PostgreSQL's server
// binaries (bash .ci/postgres installs them).
func startPostgres(ctx context.Context, dir string, logw io.Writer) (*pgServer, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		return nil, errors.New("PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin); run bash .ci/postgres, or use -store=sqlite")
	}
	sort.Strings(bins)
	p := &pgServer{bin: filepath.Dir(bins[len(bins)-1]), dir: filepath.Join(dir, "postgres"), log: logw}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs a postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(p.dir, uid, gid); err != nil {
			return nil, err
		}
		p.asPG = []string{"runuser", "-u", "postgres", "--"}
	}
	if err := p.run(ctx, "initdb", "-D", p.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	p.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pgServer) data() string { return filepath.Join(p.dir, "data") }

// start starts the stopped server and waits until it accepts connections.
// After a SIGKILL of the postmaster its orphaned backends may hold the
// shared memory for a moment: it tries again until they have gone.
func (p *pgServer) start(ctx context.Context) error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=200", p.port, p.dir)
	deadline := time.Now().Add(time.Minute)
	for {
		err := p.run(ctx, "pg_ctl", "-D", p.data(), "-l", filepath.Join(p.dir, "postgres.log"), "-w", "-t", "60", "-o", opts, "start")
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// stopImmediate stops the server as pg_ctl -m immediate does: an abort,
// recovered from the WAL at the next start.
func (p *pgServer) stopImmediate(ctx context.Context) error {
	return p.run(ctx, "pg_ctl", "-D", p.data(), "-w", "-t", "60", "-m", "immediate", "stop")
}

// kill SIGKILLs the postmaster, as a crash or the OOM killer would. Its
// backends notice and exit on their own.
func (p *pgServer) kill() error {
	pid, err := p.postmaster()
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// readOnly turns the server read-only (on) or writable again (off), for
// every session, as default_transaction_read_only set in its
// configuration and reloaded: transactions that begin after it refuse
// writes (SQLSTATE 25006) until it is turned off.
func (p *pgServer) readOnly(ctx context.Context, on bool) error {
	db, err := sql.Open("pgx", p.url)
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

// postmaster is the server's postmaster's process ID.
func (p *pgServer) postmaster() (int, error) {
	b, err := os.ReadFile(filepath.Join(p.data(), "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read the postmaster's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}

// freeze SIGSTOPs the postmaster, then every process whose parent it is,
// and returns their process IDs for thaw. Each backend and auxiliary
// process of PostgreSQL calls setsid(), so a signal to the postmaster's
// process group would not reach them; stopped first, the postmaster forks
// no process the list misses.
func (p *pgServer) freeze() ([]int, error) {
	pm, err := p.postmaster()
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
	return pids, nil
}

// thaw SIGCONTs what freeze stopped.
func thaw(pids []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// close stops the server, whatever its state.
func (p *pgServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.run(ctx, "pg_ctl", "-D", p.data(), "-w", "-m", "immediate", "stop")
}

func (p *pgServer) run(ctx context.Context, name string, args ...string) error {
	argv := append(append(append([]string(nil), p.asPG...), filepath.Join(p.bin, name)), args...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = p.dir // the postgres user may not enter the working directory
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	p.log.Write(out.Bytes())
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// patroni is a cluster that .ci/pgcluster started, driven through its CLI.
type patroni struct {
	script string
	dir    string
	log    io.Writer
	// urls are the exports of its start: PAYMENTS_PGCLUSTER_URL (through
	// HAProxy), …_MULTIHOST_URL and …_POOLER_URL.
	urls map[string]string
}

// Replication modes of a Patroni cluster (-replication), as .ci/pgcluster
// starts them.
const (
	replicationStrict    = "strict"    // synchronous_mode and synchronous_mode_strict
	replicationNonStrict = "nonstrict" // synchronous_mode alone
	replicationAsync     = "async"     // neither
)

// startPatroni starts a cluster in dir with the script (bash SCRIPT start
// DIR [--nonstrict | --async]).
func startPatroni(ctx context.Context, script, dir, replication string, logw io.Writer) (*patroni, error) {
	p := &patroni{script: script, dir: dir, log: logw, urls: make(map[string]string)}
	args := []string{"start", dir}
	if replication != replicationStrict {
		args = append(args, "--"+replication)
	}
	out, err := p.run(ctx, args...)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok {
			p.urls[name] = strings.Trim(value, `'"`)
		}
	}
	return p, nil
}

// url is the database URL through front: haproxy, multihost or pooler.
func (p *patroni) url(front string) (string, error) {
	name := map[string]string{
		"haproxy":   "PAYMENTS_PGCLUSTER_URL",
		"multihost": "PAYMENTS_PGCLUSTER_MULTIHOST_URL",
		"pooler":    "PAYMENTS_PGCLUSTER_POOLER_URL",
	}[front]
	if p.urls[name] == "" {
		return "", fmt.Errorf("%s start printed no %s (front %q)", p.script, name, front)
	}
	return p.urls[name], nil
}

// leader is the node Patroni says leads and runs, or "".
func (p *patroni) leader(ctx context.Context) (string, error) {
	out, err := p.run(ctx, "status", p.dir)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[1] == "leader" && f[2] == "running" {
			return f[0], nil
		}
	}
	return "", nil
}

// walSender is the process ID of the leader's WAL sender (the cluster has
// one standby): the chaos run stops it to stall replication.
func (p *patroni) walSender(ctx context.Context) (int, error) {
	out, err := p.run(ctx, "status", p.dir)
	if err != nil {
		return 0, err
	}
	addr := ""
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "leader" && f[2] == "running" {
			addr = f[3]
		}
	}
	if addr == "" {
		return 0, errors.New("no leader runs")
	}
	db, err := sql.Open("pgx", "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var pid int
	if err := db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&pid); err != nil {
		return 0, fmt.Errorf("find the leader's WAL sender: %w", err)
	}
	return pid, nil
}

// stop stops the cluster (thawing a frozen server first).
func (p *patroni) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p.run(ctx, "stop", p.dir)
}

// run runs the script with args and returns its stdout; its stderr goes to
// the run's log.
func (p *patroni) run(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", append([]string{p.script}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&errb, p.log)
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", p.script, args[0], err, lastLine(errb.String()))
	}
	return out.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// holdSQLiteLock takes the SQLite database's write lock from this process
// (BEGIN IMMEDIATE), as another program writing to the file would, and
// holds it until release is closed. It returns once the lock is held.
func holdSQLiteLock(ctx context.Context, path string, release <-chan struct{}) (done <-chan error, err error) {
	db, err := sql.Open(store.SQLiteDriver, store.SQLiteDSN(path, false, "busy_timeout(60000)"))
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		conn.Close()
		db.Close()
		return nil, fmt.Errorf("take the write lock: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		select {
		case <-release:
		case <-ctx.Done():
		}
		_, err := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		conn.Close()
		db.Close()
		errc <- err
	}()
	return errc, nil
}

// sleepCtx waits d or until ctx ends; it reports whether ctx is live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
