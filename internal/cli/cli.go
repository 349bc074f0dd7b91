// Package cli is 'paymentsd payments', the operators' CLI: a client of a
// running paymentsd over gRPC, which reads none of the server's
// configuration. Each command has a file of its own (list.go, get.go,
// resolve.go, and export.go with the export's format in
// exportrecord.go); what they share is here (the dispatch, and the
// preamble every command starts with: its flag set and how it is
// parsed), in conn.go (the flags that reach paymentsd), exit.go (exit
// statuses and errors), filter.go (list's and export's filters) and
// output.go (what the tables show).
package cli

import (
	"context"
	"errors"
	"flag"
	"io"
	"os/signal"
	"syscall"

	"example.com/paymentsd/internal/config"
)

const paymentsUsage = `Usage: paymentsd payments <command> [flags]

Find and settle payments in doubt, and export records for reconciliation,
talking to a running paymentsd over gRPC. list and resolve (and get or
export of other callers' payments) need an identity in
PAYMENTS_ADMIN_CALLERS: the client certificate given with --tls-cert.

Commands:
  list      List payments, as a table or JSON lines (-o json).
  get       Show one payment and its audit trail.
  resolve   Record what a person found out about a payment in doubt.
  export    Write every payment created in a time range as CSV or JSON lines.

Run 'paymentsd payments <command> --help' for a command's flags.

Exit status: 0 done; 1 paymentsd unreachable or failed; 2 bad flags or
request; 3 not allowed (CALLER_NOT_ADMIN, not on the allowlist, no client
certificate); 4 no such payment; 5 the payment is not in a state for it; 6
not confirmed.
`

// Run is 'paymentsd payments …', args being the arguments after
// "payments". It reads no PAYMENTS_* server configuration: only its
// flags, whose defaults come from the PAYMENTS_CLI_* variables in environ.
// Its questions (resolve's evidence and confirmation) are read from
// stdin. ExitCode is the status to exit with for its error.
func Run(ctx context.Context, args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	// A closed terminal ends a command as Ctrl-C does (paymentsd's main
	// already handles SIGINT and SIGTERM): an export removes its partial
	// file.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	if len(args) == 0 {
		io.WriteString(stderr, paymentsUsage)
		return usageError("payments: name a command: list, get, resolve or export")
	}
	env := config.Lookup(environ)
	switch args[0] {
	case "-h", "-help", "--help", "help":
		_, err := io.WriteString(stdout, paymentsUsage)
		return err
	case "list":
		return runList(ctx, args[1:], env, stdout, stderr)
	case "get":
		return runGet(ctx, args[1:], env, stdout, stderr)
	case "resolve":
		return runResolve(ctx, args[1:], env, stdin, stdout, stderr)
	case "export":
		return runExport(ctx, args[1:], env, stdout, stderr)
	}
	io.WriteString(stderr, paymentsUsage)
	return usageError("payments: unknown command %q", args[0])
}

// newFlagSet makes a command's flag set; --help prints usage, the
// command's text and its flags on stdout.
func newFlagSet(name, text string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("paymentsd payments "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		w := fs.Output()
		io.WriteString(w, text)
		io.WriteString(w, "\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// verb is what each command of 'paymentsd payments' starts from: its flag
// set, with the flags that reach paymentsd among them, and -o for the
// commands that print a payment.
type verb struct {
	name   string
	fs     *flag.FlagSet
	conn   ConnFlags
	stdout io.Writer
	output *string // -o, if outputFlag registered it
	json   bool    // -o json, once parsed
}

// newVerb makes the command name's flag set (see newFlagSet) and registers
// the connection flags on it; the command adds its own before parse or
// parseKey.
func newVerb(name, text string, env func(string) string, stdout, stderr io.Writer) *verb {
	v := &verb{name: name, fs: newFlagSet(name, text, stdout, stderr), stdout: stdout}
	v.conn.register(v.fs, env)
	return v
}

// outputFlag registers -o, table or json; parse and parseKey read it into
// v.json.
func (v *verb) outputFlag(usage string) {
	v.output = v.fs.String("o", "table", usage)
}

// parse parses args for a command that takes no positional arguments.
// ok is false when the command is done: --help was asked for and printed
// (err is nil), or the flags or arguments are wrong (err says how).
func (v *verb) parse(args []string) (ok bool, err error) {
	rest, ok, err := v.parseFlags(args)
	if !ok {
		return false, err
	}
	if len(rest) > 0 {
		return false, usageError("%s takes no arguments, got %q", v.name, rest)
	}
	return v.parseOutput()
}

// parseKey parses args for a command that takes one idempotency key, and
// returns it; ok and err are as parse's.
func (v *verb) parseKey(args []string) (key string, ok bool, err error) {
	rest, ok, err := v.parseFlags(args)
	if !ok {
		return "", false, err
	}
	if len(rest) != 1 {
		return "", false, usageError("%s takes one idempotency key, got %d arguments", v.name, len(rest))
	}
	ok, err = v.parseOutput()
	return rest[0], ok, err
}

// parseFlags parses args as parseArgs does and returns the positional
// arguments; ok and err are as parse's.
func (v *verb) parseFlags(args []string) (rest []string, ok bool, err error) {
	rest, err = parseArgs(v.fs, args, v.stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil, false, nil
	}
	return rest, err == nil, err
}

// parseOutput reads -o, if the command has it.
func (v *verb) parseOutput() (ok bool, err error) {
	if v.output == nil {
		return true, nil
	}
	switch *v.output {
	case "", "table":
		v.json = false
	case "json":
		v.json = true
	default:
		return false, usageError("-o %q: want table or json", *v.output)
	}
	return true, nil
}

// parseArgs parses flags given before, between or after the positional
// arguments, and returns those; after "--" every argument is positional.
// --help prints the usage once, on stdout; a bad flag, its error and the
// usage on stderr.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	usage := fs.Usage
	// The flag package prints the usage itself on -help, to its output
	// (stderr); it is printed here instead, where it belongs.
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				usage()
				return nil, flag.ErrHelp
			}
			usage()
			return nil, &exitError{ExitUsage, err}
		}
		consumed := len(args) - fs.NArg()
		rest := fs.Args()
		if consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
