package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/testenv"
)

// validSandbox is a configuration loadConfig accepts, before the variable
// a test changes.
func validSandbox(t *testing.T) map[string]string {
	return map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL": "https://sandbox.provider.test/v1",
		"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
		"PAYMENTS_DATABASE_URL":     "sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
}

func validLive(t *testing.T) map[string]string {
	return map[string]string{
		"PAYMENTS_ENVIRONMENT":   "live",
		"PAYMENTS_LIVE_BASE_URL": "https://live.provider.test/v1",
		"PAYMENTS_LIVE_API_KEY":  liveKey,
		"PAYMENTS_DATABASE_URL":  "sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
}

// TestHelp: --help exits 0 and lists every variable of the table that
// loadConfig reads, with its default and meaning.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"-h", "--help", "-help", "help"} {
		t.Run(arg, func(t *testing.T) {
			t.Parallel()
			// With a broken environment too: help needs none.
			stdout, stderr, err := runRefused(t, map[string]string{"PAYMENTS_ENVIRONMENT": "production"}, arg)
			if err != nil {
				t.Fatalf("run(%s) = %v, want nil (exit 0)", arg, err)
			}
			if stderr != "" {
				t.Errorf("run(%s) wrote %q to stderr, want the help on stdout only", arg, stderr)
			}
			if stdout != config.Usage() {
				t.Errorf("run(%s) printed %q, want config.Usage()", arg, stdout)
			}
			for _, want := range []string{"--simulate", "--version", "OTEL_", "GOGC", "_SERVICE_HOST", "paymentsd payments"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("run(%s) help lacks %s", arg, want)
				}
			}
		})
	}
}

// TestArgumentsPointAtTheCLI: a command paymentsd does not take (a CLI
// command without 'payments' before it, say) is refused with a pointer to
// the operators' CLI.
func TestArgumentsPointAtTheCLI(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"list"}, {"get", "order-1"}, {"--simulate", "resolve"}} {
		_, _, err := runRefused(t, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "paymentsd payments") {
			t.Errorf("run(%q) = %v, want a refusal that points at paymentsd payments", args, err)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	stdout, _, err := runRefused(t, nil, "--version")
	if err != nil || !strings.HasPrefix(stdout, "paymentsd ") || !strings.Contains(stdout, "go1.") {
		t.Errorf("run(--version) = %v, printed %q; want nil and paymentsd's version", err, stdout)
	}
}

// TestUnknownVariables: a PAYMENTS_* variable paymentsd doesn't read is
// refused, named, with the closest name it does read; Kubernetes' service
// links for a Service named payments… and the tests' own variables are
// not.
func TestUnknownVariables(t *testing.T) {
	t.Parallel()
	// The variables Kubernetes sets for a Service "payments" with ports
	// grpc 9090 and http 8080, and for "payments-db".
	links := map[string]string{
		"PAYMENTS_SERVICE_HOST":          "10.96.12.34",
		"PAYMENTS_SERVICE_PORT":          "9090",
		"PAYMENTS_SERVICE_PORT_GRPC":     "9090",
		"PAYMENTS_SERVICE_PORT_HTTP":     "8080",
		"PAYMENTS_PORT":                  "tcp://10.96.12.34:9090",
		"PAYMENTS_PORT_9090_TCP":         "tcp://10.96.12.34:9090",
		"PAYMENTS_PORT_9090_TCP_PROTO":   "tcp",
		"PAYMENTS_PORT_9090_TCP_PORT":    "9090",
		"PAYMENTS_PORT_9090_TCP_ADDR":    "10.96.12.34",
		"PAYMENTS_PORT_8080_TCP":         "tcp://10.96.12.34:8080",
		"PAYMENTS_DB_SERVICE_HOST":       "fd00::12",
		"PAYMENTS_DB_SERVICE_PORT":       "5432",
		"PAYMENTS_DB_PORT_5432_TCP_ADDR": "fd00::12",
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		refused string // the name the refusal names; "" to start
		suggest string // the name it suggests
	}{
		{"misspelt", map[string]string{"PAYMENTS_UPSTREAM_TIMEOT": "10s"}, "PAYMENTS_UPSTREAM_TIMEOT", "PAYMENTS_UPSTREAM_TIMEOUT"},
		{"missing an underscore", map[string]string{"PAYMENTS_MAXINFLIGHT": "10"}, "PAYMENTS_MAXINFLIGHT", "PAYMENTS_MAX_IN_FLIGHT"},
		{"lower case", map[string]string{"payments_grpc_addr": ":9091"}, "payments_grpc_addr", "PAYMENTS_GRPC_ADDR"},
		{"key without its environment", map[string]string{"PAYMENTS_API_KEY_FILE": "/x"}, "PAYMENTS_API_KEY_FILE", "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"nothing like it", map[string]string{"PAYMENTS_FROBNICATE": "1"}, "PAYMENTS_FROBNICATE", ""},
		{"a port variable without its Service", map[string]string{"PAYMENTS_GRPC_PORT": "9091"}, "PAYMENTS_GRPC_PORT", ""},
		{"Kubernetes service links", links, "", ""},
		{"the other environment's variables", map[string]string{"PAYMENTS_LIVE_BASE_URL": "https://x/v1", "PAYMENTS_LIVE_API_KEY": liveKey}, "", ""},
		{"the tests' database", map[string]string{"PAYMENTS_TEST_POSTGRES_URL": "postgres://x@127.0.0.1:1/y"}, "", ""},
		{"not a payments variable", map[string]string{"PAYMENTSD_X": "1", "OTEL_SERVICE_NAME": "p", "GOGC": "100", "GOMEMLIMIT": "1GiB"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := validSandbox(t)
			for k, v := range tc.env {
				env[k] = v
			}
			_, err := loadConfig([]string{"paymentsd"}, envList(env))
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("loadConfig() = %v, want it to start", err)
			case tc.refused == "":
				return
			case err == nil:
				t.Fatalf("loadConfig(%s set) = nil, want a refusal naming it", tc.refused)
			}
			if !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("loadConfig() = %q, want it to name %s", err, tc.refused)
			}
			if tc.suggest != "" && !strings.Contains(err.Error(), "did you mean "+tc.suggest+"?") {
				t.Errorf("loadConfig() = %q, want it to suggest %s", err, tc.suggest)
			}
			for _, v := range tc.env {
				if len(v) > 3 && strings.Contains(err.Error(), v) {
					t.Errorf("loadConfig() = %q repeats the value %q", err, v)
				}
			}
		})
	}

	// A name shaped like no variable's is not repeated.
	_, err := loadConfig([]string{"paymentsd"}, append(envList(validSandbox(t)), "PAYMENTS_"+sandboxKey+"-x=1"))
	if err == nil || strings.Contains(err.Error(), sandboxKey) {
		t.Errorf("loadConfig(a name holding a key) = %v, want a refusal that doesn't repeat it", err)
	}
}

// TestUnknownVariableRefusedAtStart runs the refusal through run, as a
// deployment would meet it.
func TestUnknownVariableRefusedAtStart(t *testing.T) {
	t.Parallel()
	_, _, err := runRefused(t, with(validSandbox(t), "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
		"PAYMENTS_SETTLEMENT_WINDOWS", "1h"))
	if err == nil || !strings.Contains(err.Error(), "PAYMENTS_SETTLEMENT_WINDOWS") || !strings.Contains(err.Error(), "PAYMENTS_SETTLEMENT_WINDOW?") {
		t.Errorf("run(PAYMENTS_SETTLEMENT_WINDOWS set) = %v, want a refusal suggesting PAYMENTS_SETTLEMENT_WINDOW", err)
	}
}

// TestLiveNeedsDatabaseURL: live never falls back to a SQLite file in the
// working directory.
func TestLiveNeedsDatabaseURL(t *testing.T) {
	t.Parallel()
	env := validLive(t)
	delete(env, "PAYMENTS_DATABASE_URL")
	_, err := loadConfig([]string{"paymentsd"}, envList(env))
	if err == nil || !strings.Contains(err.Error(), "PAYMENTS_DATABASE_URL") {
		t.Errorf("loadConfig(live, no database) = %v, want a refusal naming PAYMENTS_DATABASE_URL", err)
	}
	env = validSandbox(t)
	delete(env, "PAYMENTS_DATABASE_URL")
	if c, err := loadConfig([]string{"paymentsd"}, envList(env)); err != nil || c.DatabaseShown != "sqlite:paymentsd-sandbox.db" {
		t.Errorf("loadConfig(sandbox, no database) = %v; want the default sqlite:paymentsd-sandbox.db", err)
	}
}

// TestDefaultDatabaseFailureNamesTheFile: a default SQLite file that
// can't be created is named, with where it came from.
func TestDefaultDatabaseFailureNamesTheFile(t *testing.T) {
	t.Parallel()
	env := validSandbox(t)
	env["PAYMENTS_DATABASE_URL"] = "sqlite:" + filepath.Join(t.TempDir(), "no", "such", "dir", "records.db")
	env["PAYMENTS_GRPC_ADDR"], env["PAYMENTS_HTTP_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
	_, _, err := runRefused(t, env)
	if err == nil || !strings.Contains(err.Error(), env["PAYMENTS_DATABASE_URL"]) {
		t.Errorf("run(a SQLite file in a missing directory) = %v, want a refusal naming the file", err)
	}
}

// TestFileErrorsSayWhere: a file variable naming a missing file says which
// directory on its path exists (not the path, which may be a pasted key);
// one naming a file that exists but can't be read names it.
func TestFileErrorsSayWhere(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, vr := range []string{"PAYMENTS_SANDBOX_API_KEY_FILE", "PAYMENTS_DATABASE_URL_FILE", "PAYMENTS_TLS_CLIENT_CA_FILE", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE"} {
		env := validSandbox(t)
		if vr == "PAYMENTS_SANDBOX_API_KEY_FILE" {
			delete(env, "PAYMENTS_SANDBOX_API_KEY")
		}
		if vr == "PAYMENTS_DATABASE_URL_FILE" {
			delete(env, "PAYMENTS_DATABASE_URL")
		}
		_, err := loadConfig([]string{"paymentsd"}, envList(with(env, vr, filepath.Join(dir, "mount", "secret-file"))))
		if err == nil || !strings.Contains(err.Error(), vr) || !strings.Contains(err.Error(), dir) || strings.Contains(err.Error(), "secret-file") {
			t.Errorf("loadConfig(%s missing) = %v, want it to name %s and the directory %s, not the file", vr, err, vr, dir)
		}
		_, err = loadConfig([]string{"paymentsd"}, envList(with(env, vr, dir)))
		if err == nil || !strings.Contains(err.Error(), vr) || !strings.Contains(err.Error(), dir) {
			t.Errorf("loadConfig(%s a directory) = %v, want it to name %s and the directory", vr, err, vr)
		}
	}
}

// oddURLs are database URLs whose password a parser could take for
// another part: each must stay out of every output.
var oddURLs = []struct {
	name, url string
	pieces    []string // what of the password must never be printed
}{
	{"unescaped @", "postgres://paymentsd:Tr0ub4dor@3xkcd@db.internal/payments", []string{"Tr0ub4dor", "3xkcd"}},
	{"unescaped @ on loopback", "postgres://paymentsd:Pw4Sentinel@Sentinel99@127.0.0.1:1/payments?sslmode=disable", []string{"Pw4Sentinel", "Sentinel99"}},
	{"two @", "postgres://u:Aaaa1111@Bbbb2222@Cccc3333@db.internal/p", []string{"Aaaa1111", "Bbbb2222", "Cccc3333"}},
	{"#", "postgres://paymentsd:Hash1111#Hash2222@db.internal/payments", []string{"Hash1111", "Hash2222"}},
	{"# at the start", "postgres://paymentsd:#Hash3333@db.internal/payments", []string{"Hash3333"}},
	{"/", "postgres://paymentsd:Slash111/Slash222@db.internal/payments", []string{"Slash111", "Slash222"}},
	{"?", "postgres://paymentsd:Quest111?Quest222@db.internal/payments", []string{"Quest111", "Quest222"}},
	{"% alone", "postgres://paymentsd:Pct11111%Pct22222@db.internal/payments", []string{"Pct11111", "Pct22222"}},
	{"@ and /", "postgres://paymentsd:Mix11111/Mix22222@Mix33333@db.internal/payments", []string{"Mix11111", "Mix22222", "Mix33333"}},
	{"password in the query", "postgres://paymentsd@127.0.0.1:1/payments?sslmode=disable&password=Query111", []string{"Query111"}},
	{"password in the query, bad escape", "postgres://paymentsd@127.0.0.1:1/payments?password=Query222%zz", []string{"Query222"}},
	{"parameter without =", "postgres://paymentsd:Param111@127.0.0.1:1/payments?Param222", []string{"Param111", "Param222"}},
	{"wrong scheme", "mysql://paymentsd:Scheme11@db.internal/payments", []string{"Scheme11"}},
	{"no scheme", "paymentsd:NoSchem1@db.internal/payments", []string{"NoSchem1"}},
	{"escaped, refused by the server", "postgres://paymentsd:Esc11111%40Esc22222@127.0.0.1:1/payments?sslmode=disable", []string{"Esc11111", "Esc22222"}},
}

// TestDatabaseURLNeverLeaks runs paymentsd with each odd URL, in
// PAYMENTS_DATABASE_URL and in a file: no piece of its password is in the
// refusal, stdout or the logs.
func TestDatabaseURLNeverLeaks(t *testing.T) {
	t.Parallel()
	for _, tc := range oddURLs {
		for _, from := range []string{"PAYMENTS_DATABASE_URL", "PAYMENTS_DATABASE_URL_FILE"} {
			t.Run(tc.name+"/"+from, func(t *testing.T) {
				t.Parallel()
				env := with(validSandbox(t), "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
					"PAYMENTS_DATABASE_CONNECT_TIMEOUT", "2s")
				if from == "PAYMENTS_DATABASE_URL" {
					env[from] = tc.url
				} else {
					delete(env, "PAYMENTS_DATABASE_URL")
					file := filepath.Join(t.TempDir(), "url")
					if err := os.WriteFile(file, []byte(tc.url+"\n"), 0o600); err != nil {
						t.Fatal(err)
					}
					env[from] = file
				}
				stdout, stderr, err := runRefused(t, env)
				if err == nil {
					t.Fatal("run() = nil, want a refusal")
				}
				if !strings.Contains(err.Error(), from) {
					t.Errorf("run() = %q, want it to name %s", err, from)
				}
				for _, out := range []string{err.Error(), stdout, stderr} {
					for _, p := range tc.pieces {
						if strings.Contains(out, p) {
							t.Errorf("output holds %q of the password:\n%s", p, out)
						}
					}
				}
				t.Log(err)
			})
		}
	}
}

// TestDatabaseAdviceToEscape: each URL whose password could run into
// another part is refused before any connection, with the advice to
// percent-encode.
func TestDatabaseAdviceToEscape(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://paymentsd:Tr0ub4dor@3xkcd@db.internal/payments",
		"postgres://paymentsd:12#34@db.internal/payments",
		"postgres://paymentsd:#1234@db.internal/payments",
		"postgres://paymentsd:12/34@db.internal/payments",
		"postgres://paymentsd:12?34@db.internal/payments",
	} {
		_, err := loadConfig([]string{"paymentsd"}, envList(with(validSandbox(t), "PAYMENTS_DATABASE_URL", u)))
		if err == nil || !strings.Contains(err.Error(), "PAYMENTS_DATABASE_URL") || !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("loadConfig(an odd database URL) = %v, want a refusal naming PAYMENTS_DATABASE_URL with advice to percent-encode", err)
		}
	}
}

// TestStartupShowsTheHostDialled: the start-up line shows where pgx will
// connect, a host= in the query included, and the refusal names it.
func TestStartupShowsTheHostDialled(t *testing.T) {
	t.Parallel()
	env := with(validSandbox(t), "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
		"PAYMENTS_DATABASE_URL", "postgres://paymentsd:Pw%40Sentinel77@db.internal/payments?sslmode=disable&host=127.0.0.2&port=1")
	_, stderr, err := runRefused(t, env)
	if err == nil {
		t.Fatal("run() = nil, want a refusal: nothing listens on 127.0.0.2:1")
	}
	logs := &logBuffer{changed: make(chan struct{})}
	logs.Write([]byte(stderr))
	starting := logs.lines("starting")
	if len(starting) != 1 {
		t.Fatalf("logged %d starting lines, want 1:\n%s", len(starting), stderr)
	}
	shown, _ := starting[0]["config"].(map[string]any)["database"].(string)
	if !strings.Contains(shown, "host=127.0.0.2") || !strings.Contains(shown, "port=1") {
		t.Errorf("starting line shows database %q, want the host dialled, 127.0.0.2 port 1", shown)
	}
	for _, out := range []string{err.Error(), stderr} {
		if strings.Contains(out, "Sentinel77") {
			t.Errorf("output holds the password:\n%s", out)
		}
	}
}

// TestHungDatabase: a database that accepts connections and never answers
// stops start-up within PAYMENTS_DATABASE_CONNECT_TIMEOUT with a refusal
// naming it, after a line saying what is awaited and which variable bounds
// the wait.
func TestHungDatabase(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(conns)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c // never answered
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range conns {
			c.Close()
		}
	})
	env := with(validSandbox(t), "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
		"PAYMENTS_DATABASE_URL", "postgres://paymentsd:HungSentinel1@"+ln.Addr().String()+"/payments?sslmode=disable",
		"PAYMENTS_DATABASE_CONNECT_TIMEOUT", "1s")
	// The context is a guard against a hang, not a timed assertion: run
	// must give up by itself (ErrConnectTimeout, below), long before.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	logs := newLogBuffer()
	err = run(ctx, []string{"paymentsd"}, envList(env), &strings.Builder{}, logs)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("run() against a hung database = %v, want a refusal once the connect timeout passed", err)
	}
	if !strings.Contains(err.Error(), "PAYMENTS_DATABASE_CONNECT_TIMEOUT") {
		t.Errorf("run() = %q, want it to name PAYMENTS_DATABASE_CONNECT_TIMEOUT", err)
	}
	opening := logs.lines("opening the record store")
	if len(opening) != 1 || opening[0]["connect_timeout_from"] != "PAYMENTS_DATABASE_CONNECT_TIMEOUT" || opening[0]["connect_timeout"] != "1s" {
		t.Errorf("logged %v before waiting, want one line naming the wait and PAYMENTS_DATABASE_CONNECT_TIMEOUT", opening)
	}
	if strings.Contains(err.Error()+logs.String(), "HungSentinel1") {
		t.Errorf("output holds the password")
	}
	if !errors.Is(err, store.ErrConnectTimeout) {
		t.Errorf("run() = %v, want store.ErrConnectTimeout", err)
	}
	t.Log(err)
}

// TestSecretFileNotRegular: a key or token file variable naming a named
// pipe is refused at once, naming the variable, rather than hanging
// startup (and every reload, and shutdown) until something writes to it.
func TestSecretFileNotRegular(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "api-key")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		testenv.Missing(t, "mkfifo: %v", err)
	}
	// Unblock a reader stuck opening the pipe, whatever the test found.
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	for _, vr := range []string{"PAYMENTS_SANDBOX_API_KEY_FILE", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE"} {
		env := validSandbox(t)
		delete(env, "PAYMENTS_SANDBOX_API_KEY")
		delete(env, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN")
		if vr == "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE" {
			env = with(env, "PAYMENTS_SANDBOX_API_KEY", sandboxKey)
		}
		done := make(chan error, 1)
		go func() {
			_, err := loadConfig([]string{"paymentsd"}, envList(with(env, vr, fifo)))
			done <- err
		}()
		// A guard against a hang, not a timed assertion: the refusal
		// needs no waiting at all.
		hang := time.NewTimer(time.Minute)
		select {
		case err := <-done:
			hang.Stop()
			if err == nil || !strings.Contains(err.Error(), vr) {
				t.Errorf("loadConfig(%s a named pipe) = %v, want a refusal naming %s", vr, err, vr)
			}
		case <-hang.C:
			t.Fatalf("loadConfig(%s a named pipe) still blocked after a minute", vr)
		}
	}
}
