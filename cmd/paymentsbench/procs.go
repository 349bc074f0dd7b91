package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"example.com/paymentsd/internal/proc"
)

// environment is what the benchmark starts its processes from.
type environment struct {
	paymentsd   string // the paymentsd binary
	self        string // this binary, re-executed as the fake provider and the floors
	providerKey string // the key the fake provider accepts
	dbs         *databases
	pprof       bool   // paymentsd was built to write CPU profiles
	gogc        string // GOGC for paymentsd, or ""
	// baseline is the paymentsd binary built at -baseline, or "", and
	// baselineRev names its revision and commit.
	baseline, baselineRev string
}

// benchProfileEnv names the file a paymentsd built with the benchprofile
// tag writes its CPU profile to (see cmd/paymentsd/benchprofile.go).
const benchProfileEnv = "PAYMENTS_BENCH_CPUPROFILE"

// buildPaymentsd builds paymentsd into dir and returns the binary's path.
// With profile it is built with the benchprofile tag, which lets the
// benchmark take CPU profiles of it; the production binary can't.
//
// It is built with this binary's own build tags, so that a driver tag
// (go run -tags sqlite_ncruces ./cmd/paymentsbench) gives paymentsd and the
// record floors the same SQLite driver.
func buildPaymentsd(ctx context.Context, dir string, profile bool, stderr io.Writer) (string, error) {
	var tags []string
	if profile {
		tags = append(tags, "benchprofile")
	}
	return proc.BuildPaymentsd(ctx, dir, tags, stderr)
}

// baselineSuffix ends the names of the paths (and processes) of the
// paymentsd built at -baseline: grpc/sqlite@base is grpc/sqlite as it was.
const baselineSuffix = "@base"

// buildBaseline builds paymentsd as it was at the git revision rev, from a
// copy of the module at rev (git archive) in dir, with this binary's build
// tags, and returns the binary and the commit it was built from. It must
// run from inside the module's git work tree.
func buildBaseline(ctx context.Context, rev, dir string, stderr io.Writer) (bin, commit string, err error) {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "--verify", rev+"^{commit}").Output()
	if err != nil {
		return "", "", fmt.Errorf("-baseline %s: not a commit of this repository: %w", rev, err)
	}
	commit = strings.TrimSpace(string(out))
	src := filepath.Join(dir, "baseline-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	archive := exec.CommandContext(ctx, "git", "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	if untar.Stdin, err = archive.StdoutPipe(); err != nil {
		return "", "", err
	}
	archive.Stderr, untar.Stderr = stderr, stderr
	if err := untar.Start(); err != nil {
		return "", "", err
	}
	if err := errors.Join(archive.Run(), untar.Wait()); err != nil {
		return "", "", fmt.Errorf("-baseline %s: copy the tree: %w", rev, err)
	}
	bin = filepath.Join(dir, "paymentsd-baseline")
	args := []string{"build", "-C", src, "-o", bin}
	if tags := proc.BuildTags(); len(tags) > 0 {
		args = append(args, "-tags="+strings.Join(tags, ","))
	}
	build := exec.CommandContext(ctx, "go", append(args, "./cmd/paymentsd")...)
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return "", "", fmt.Errorf("-baseline %s: build paymentsd: %w", rev, err)
	}
	return bin, commit, nil
}

// sqliteDriver is the SQLite driver module this binary (and so paymentsd
// and the record floors) was built with, and its version.
func sqliteDriver() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range info.Deps {
		switch m.Path {
		case "modernc.org/sqlite", "github.com/ncruces/go-sqlite3", "github.com/mattn/go-sqlite3":
			return m.Path + " " + m.Version
		}
	}
	return ""
}

// fakeProcess is a running fake provider.
type fakeProcess struct {
	*proc.Process
	addr      string // payments
	statsAddr string // GET /stats, on a listener of its own
}

func (f *fakeProcess) paymentURL() string { return "http://" + f.addr + "/v1/multi-card-payments" }

// startFake starts a fake provider that holds every reply for delay.
func (e *environment) startFake(ctx context.Context, name string, delay time.Duration) (*fakeProcess, error) {
	c, ready, err := proc.Start(ctx, proc.Command{Name: name, Path: e.self, Args: []string{
		fakeProviderFlag, "-addr=127.0.0.1:0", "-stats-addr=127.0.0.1:0",
		"-delay=" + delay.String(), "-key=" + e.providerKey}})
	if err != nil {
		return nil, err
	}
	if ready.Addr == "" || ready.StatsAddr == "" {
		c.Stop()
		return nil, fmt.Errorf("%s reported no addresses", name)
	}
	return &fakeProcess{Process: c, addr: ready.Addr, statsAddr: ready.StatsAddr}, nil
}

// serviceProcess is a running paymentsd.
type serviceProcess struct {
	*proc.Process
	grpcAddr string
	httpAddr string
	store    string // storeSQLite, storePostgres or storeMemory
	// profile is where paymentsd writes a CPU profile between SIGUSR1 and
	// SIGUSR2, when built with the benchprofile tag (-pprof).
	profile string
}

// startPaymentsd starts paymentsd in the sandbox environment against fake,
// with a fresh database of the store kind, at the default log level, so
// that every call writes its access-log line as in production. extraEnv
// adds or overrides settings.
func (e *environment) startPaymentsd(ctx context.Context, name, binary, storeKind string, fake *fakeProcess, extraEnv ...string) (*serviceProcess, error) {
	dbURL, err := e.dbs.url(ctx, storeKind, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	env := []string{
		"PAYMENTS_ENVIRONMENT=sandbox",
		"PAYMENTS_SANDBOX_BASE_URL=http://" + fake.addr + "/v1",
		"PAYMENTS_SANDBOX_API_KEY=" + e.providerKey,
		"PAYMENTS_GRPC_ADDR=127.0.0.1:0",
		"PAYMENTS_HTTP_ADDR=127.0.0.1:0",
		"PAYMENTS_DATABASE_URL=" + dbURL,
	}
	var profile string
	if e.pprof && binary == e.paymentsd {
		profile = filepath.Join(e.dbs.dir, name+".pprof")
		env = append(env, benchProfileEnv+"="+profile)
	}
	if e.gogc != "" {
		env = append(env, "GOGC="+e.gogc)
	}
	env = append(env, extraEnv...)
	c, ready, err := proc.Start(ctx, proc.Command{Name: name, Path: binary, Env: env})
	if err != nil {
		return nil, err
	}
	if ready.GRPCAddr == "" || ready.HTTPAddr == "" {
		c.Stop()
		return nil, fmt.Errorf("%s reported no addresses", name)
	}
	return &serviceProcess{Process: c, grpcAddr: ready.GRPCAddr, httpAddr: ready.HTTPAddr, store: storeKind, profile: profile}, nil
}
