package storetest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"example.com/paymentsd/internal/testenv"
)

// Cluster is a PostgreSQL server of a test's own, which the test may stop
// and start (as a failing database would), unlike the shared server of
// PAYMENTS_TEST_POSTGRES_URL.
type Cluster struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	asPG []string // the command prefix that runs as the postgres user
	// URL is the cluster's postgres database, for the postgres superuser.
	URL string
}

// StartCluster initdbs and starts a throwaway PostgreSQL cluster on a free
// loopback port, trusting local connections; t.Cleanup stops it and
// removes its files. It needs PostgreSQL's server binaries (as `bash
// .ci/postgres` installs them): without them it skips the test, except
// under CI=true, where it fails it. As root, the server runs as the
// postgres user, as PostgreSQL requires.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		testenv.Missing(t, "PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin); run bash .ci/postgres")
	}
	sort.Strings(bins)
	c := &Cluster{t: t, bin: filepath.Dir(bins[len(bins)-1])}

	dir, err := os.MkdirTemp("", "paymentsd-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.asPG = []string{"runuser", "-u", "postgres", "--"}
	}
	c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.Start()
	t.Cleanup(func() { c.pgctl("stop", "-m", "immediate") })
	return c
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// Start starts the server, which must be stopped, and waits until it
// accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=100", c.port, c.dir)
	c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "postgres.log"), "-w", "-t", "60", "-o", opts, "start")
}

// Stop stops the server with pg_ctl's shutdown mode: "fast" (roll back
// open transactions, close connections) or "immediate" (abort, as a crash
// would; the next start recovers from the WAL).
func (c *Cluster) Stop(mode string) {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.data(), "-w", "-t", "60", "-m", mode, "stop")
}

// Kill kills the server with SIGKILL, the postmaster and every process it
// started, as a crash would, and waits until they are gone. Start starts
// it again, recovering from the WAL.
func (c *Cluster) Kill() {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("kill the server: %v", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		c.t.Fatalf("kill the server: postmaster.pid holds %q", first)
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
				c.t.Fatalf("process %d of the killed server is still there", p)
			}
			time.Sleep(10 * time.Millisecond) // no signal for another process's end
		}
	}
}

// Freeze stops the server with SIGSTOP, the postmaster and every process
// it started: a hung server, whose connections stay open and whose
// statements and commits neither finish nor fail. It returns thaw, which
// sends them SIGCONT; t.Cleanup thaws it too.
func (c *Cluster) Freeze() (thaw func()) {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("freeze the server: %v", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		c.t.Fatalf("freeze the server: postmaster.pid holds %q", first)
	}
	// Stopped first, the postmaster forks no child the list misses.
	syscall.Kill(pid, syscall.SIGSTOP)
	pids := append([]int{pid}, childrenOf(pid)...)
	for _, p := range pids[1:] {
		syscall.Kill(p, syscall.SIGSTOP)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			for _, p := range pids {
				syscall.Kill(p, syscall.SIGCONT)
			}
		})
	}
	c.t.Cleanup(thaw)
	return thaw
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
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

func (c *Cluster) pgctl(args ...string) {
	cmd := exec.Command(filepath.Join(c.bin, "pg_ctl"), append([]string{"-D", c.data()}, args...)...)
	if len(c.asPG) > 0 {
		cmd = exec.Command(c.asPG[0], append(append(c.asPG[1:], filepath.Join(c.bin, "pg_ctl"), "-D", c.data()), args...)...)
	}
	// The postgres user may not enter the test's working directory.
	cmd.Dir = c.dir
	cmd.Run()
}

func (c *Cluster) run(name string, args ...string) {
	c.t.Helper()
	argv := append([]string{filepath.Join(c.bin, name)}, args...)
	if len(c.asPG) > 0 {
		argv = append(append([]string(nil), c.asPG...), argv...)
	}
	var out bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.dir // the postgres user may not enter the test's working directory
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
		c.t.Fatalf("%s: %v\n%s\n%s", name, err, out.String(), log)
	}
}
