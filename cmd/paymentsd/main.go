// Command paymentsd serves payments.v1.PaymentsService over gRPC and REST,
// forwarding payments to one environment of the payment provider.
//
// Configuration comes from PAYMENTS_* environment variables, which
// paymentsd --help lists; --simulate serves against a built-in simulated
// provider instead.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"example.com/paymentsd/internal/cli"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/daemon"
)

// defaultGCPercent is the GC target when GOGC is not set. paymentsd's live
// heap is small (a few MiB idle, tens with thousands of calls in flight),
// so the default GOGC=100 collects very often: 400 measured 15–19% less
// CPU per call. GOMEMLIMIT, which deploy/ sets to 90% of the pod's memory
// limit, stays the backstop: near it the runtime collects harder whatever
// GOGC says. Setting GOGC (even to 100) overrides this.
const defaultGCPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if err := run(context.Background(), os.Args, os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "paymentsd: %v\n", err)
		os.Exit(cli.ExitCode(err))
	}
}

// run is the whole program: it returns when ctx ends or a signal arrives
// and the service has drained, or when it cannot start. environ is the
// environment as os.Environ gives it: the whole list, so that a PAYMENTS_*
// variable paymentsd doesn't know can be refused.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	// 'paymentsd payments …' is the operators' CLI, a client of a running
	// paymentsd: it reads none of the server's configuration. Its
	// questions (resolve's evidence and confirmation) are read from the
	// terminal.
	if len(args) > 1 && args[1] == "payments" {
		return cli.Run(ctx, args[2:], environ, os.Stdin, stdout, stderr)
	}

	cfg, err := loadConfig(args, environ)
	switch {
	case errors.Is(err, config.ErrHelp):
		_, err := io.WriteString(stdout, config.Usage())
		return err
	case errors.Is(err, config.ErrVersion):
		_, err := fmt.Fprintln(stdout, "paymentsd", version())
		return err
	case err != nil:
		return err
	}

	return daemon.Run(ctx, cfg, environ, stdout, stderr)
}

// loadConfig is config.Load, stamped with this binary's version.
func loadConfig(args, environ []string) (*config.Config, error) {
	cfg, err := config.Load(args, environ)
	if cfg != nil {
		cfg.Version, cfg.Release = version(), releaseVersion()
	}
	return cfg, err
}
