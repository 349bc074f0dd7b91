// Package proc starts the processes that the repository's load and fault
// tools run on loopback (paymentsd built from this module, and helpers
// such as a fake provider), waits until each says it serves, and stops or
// kills them.
package proc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StartTimeout bounds how long a process may take to report that it
// serves.
const StartTimeout = 30 * time.Second

// BuildPaymentsd builds paymentsd into dir and returns the binary's path.
// It is built with the calling binary's own build tags, plus extraTags,
// so that a driver tag (go run -tags sqlite_ncruces ./cmd/paymentsbench)
// gives paymentsd the same SQLite driver. It must run from inside the
// module.
func BuildPaymentsd(ctx context.Context, dir string, extraTags []string, stderr io.Writer) (string, error) {
	bin := filepath.Join(dir, "paymentsd")
	args := []string{"build", "-o", bin}
	tags := append(BuildTags(), extraTags...)
	if len(tags) > 0 {
		args = append(args, "-tags="+strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "example.com/paymentsd/cmd/paymentsd")...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build paymentsd (run from inside the module): %w", err)
	}
	return bin, nil
}

// BuildTags are the build tags the calling binary was built with.
func BuildTags() []string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	for _, st := range info.Settings {
		if st.Key == "-tags" && st.Value != "" {
			return strings.Split(st.Value, ",")
		}
	}
	return nil
}

// Command is a process to start.
type Command struct {
	// Name names the process in errors.
	Name string
	Path string
	Args []string
	// Env is added to the inherited environment, from which PAYMENTS_*,
	// OTEL_* and the Go runtime's variables are removed (see CleanEnv).
	Env []string
	// Log, if not nil, gets all of the process's output as well.
	Log io.Writer
}

// Serving is the JSON log line a process writes once it serves: paymentsd
// gives its gRPC and HTTP addresses, a helper its own.
type Serving struct {
	Msg       string `json:"msg"`
	GRPCAddr  string `json:"grpc_addr"`
	HTTPAddr  string `json:"http_addr"`
	Addr      string `json:"addr"`
	StatsAddr string `json:"stats_addr"`
}

// Process is a process that Start started.
type Process struct {
	Name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	out    *output
	exited chan struct{}
	err    error // from Wait; read after exited is closed
}

// Start starts c and waits for its "serving" line. When ctx ends, the
// process is sent SIGTERM, and SIGKILL 5 s later; on Linux the kernel
// kills it if the caller dies first.
func Start(ctx context.Context, c Command) (*Process, Serving, error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Env = append(CleanEnv(), c.Env...)
	out := &output{ready: make(chan Serving, 1), log: c.Log}
	cmd.Stdout, cmd.Stderr = out, out
	// On cancel, ask it to stop; if it has not within WaitDelay, kill it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, Serving{}, fmt.Errorf("start %s: %w", c.Name, err)
	}
	p := &Process{Name: c.Name, cmd: cmd, cancel: cancel, out: out, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()

	timer := time.NewTimer(StartTimeout)
	defer timer.Stop()
	select {
	case ready := <-out.ready:
		return p, ready, nil
	case <-p.exited:
		cancel()
		return nil, Serving{}, fmt.Errorf("%s exited before serving (%v); its output:\n%s", c.Name, p.err, out)
	case <-timer.C:
		p.Stop()
		return nil, Serving{}, fmt.Errorf("%s did not report serving within %v; its output:\n%s", c.Name, StartTimeout, out)
	case <-ctx.Done():
		p.Stop()
		return nil, Serving{}, ctx.Err()
	}
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop ends the process, if it is still running (SIGTERM, then SIGKILL
// after 5 s), and waits for it. It may be called more than once.
func (p *Process) Stop() {
	p.cancel()
	<-p.exited
}

// Kill kills the process with SIGKILL, as a crash or an OOM kill would,
// and waits for it to exit.
func (p *Process) Kill() {
	p.cmd.Process.Kill()
	<-p.exited
	p.cancel()
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// CheckRunning reports an error if the process has exited.
func (p *Process) CheckRunning() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%v); its output:\n%s", p.Name, p.err, p.out)
	default:
		return nil
	}
}

// CleanEnv is this process's environment without PAYMENTS_*, OTEL_* and
// Go runtime (GOGC, GOMEMLIMIT, GODEBUG) variables, so that a developer's
// shell settings cannot change what is measured or tried.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYMENTS_") && !strings.HasPrefix(kv, "OTEL_") &&
			!strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") && !strings.HasPrefix(kv, "GODEBUG=") {
			env = append(env, kv)
		}
	}
	return env
}

// output takes a process's stdout and stderr, so that they never block
// it. It sends the first "serving" line on ready, and keeps the output up
// to that line and the latest output after it, for error messages; the
// rest, such as paymentsd's access log, goes only to log, if any.
type output struct {
	ready chan Serving
	log   io.Writer

	mu         sync.Mutex
	head       []byte // up to the serving line
	scanned    int    // how much of head has been searched for it
	seen       bool
	prev, last []byte // the two latest writes after it
}

// maxHead bounds head, in case the serving line never comes.
const maxHead = 64 << 10

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.log != nil {
		o.log.Write(p)
	}
	if o.seen {
		o.prev, o.last = o.last, append(o.prev[:0], p...)
		return len(p), nil
	}
	o.head = append(o.head, p...)
	for !o.seen {
		i := bytes.IndexByte(o.head[o.scanned:], '\n')
		if i < 0 {
			break
		}
		line := o.head[o.scanned : o.scanned+i]
		o.scanned += i + 1
		var s Serving
		if json.Unmarshal(line, &s) == nil && s.Msg == "serving" {
			o.seen = true
			o.ready <- s
		}
	}
	if len(o.head) > maxHead {
		o.head = append(o.head[:maxHead/2], "\n…\n"...)
		o.scanned = len(o.head)
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := string(o.head)
	if len(o.prev)+len(o.last) > 0 {
		s += "…\n" + string(o.prev) + string(o.last)
	}
	return s
}
