package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// The CLI's exit statuses. main exits 1 for any other error.
const (
	exitFailure  = 1 // paymentsd could not be reached or failed; nothing is known to have changed
	exitUsage    = 2 // bad flags or arguments, or a request paymentsd called invalid
	exitDenied   = 3 // not allowed: not an admin (CALLER_NOT_ADMIN), not on the allowlist, or no identity (no client certificate)
	exitNotFound = 4 // no record of the key
	exitRefused  = 5 // the record is not in a state for it (not OUTCOME_UNKNOWN, or a request is in flight); nothing changed
	exitDeclined = 6 // the person did not confirm; nothing was sent
)

// exitError is an error with the exit status main gives it.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the status main exits with for err.
func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitFailure
}

func usageError(format string, args ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, args...)}
}

// callError turns a failed call into an error naming the call, the gRPC
// code and paymentsd's reason, with the matching exit status.
func callError(what string, err error) error {
	st := status.Convert(err)
	reason := ""
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	code := exitFailure
	switch st.Code() {
	case codes.InvalidArgument:
		code = exitUsage
	case codes.PermissionDenied, codes.Unauthenticated:
		code = exitDenied
	case codes.NotFound:
		code = exitNotFound
	case codes.FailedPrecondition, codes.Aborted:
		code = exitRefused
	}
	msg := st.Code().String()
	if reason != "" {
		msg += " " + reason
	}
	if retry > 0 {
		// PAYMENT_IN_PROGRESS and the like: say when trying again can help.
		return &exitError{code, fmt.Errorf("%s: %s: %s (try again in %v)", what, msg, st.Message(), retry.Round(100*time.Millisecond))}
	}
	return &exitError{code, fmt.Errorf("%s: %s: %s", what, msg, st.Message())}
}

// retryDelayOf is the RetryInfo's delay in err's status, or 0.
func retryDelayOf(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// The CLI's environment variables, each the default of a flag. paymentsd
// itself ignores them (see ignoredVariables).
const (
	envCLIAddr       = "PAYMENTS_CLI_ADDR"
	envCLICA         = "PAYMENTS_CLI_TLS_CA_FILE"
	envCLICert       = "PAYMENTS_CLI_TLS_CERT_FILE"
	envCLIKey        = "PAYMENTS_CLI_TLS_KEY_FILE"
	envCLIServerName = "PAYMENTS_CLI_SERVER_NAME"
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

// runPayments is 'paymentsd payments …', the operators' CLI. It reads no
// PAYMENTS_* server configuration: only its flags, whose defaults come
// from the PAYMENTS_CLI_* variables in environ.
func runPayments(ctx context.Context, args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	// A closed terminal ends a command as Ctrl-C does (run already
	// handles SIGINT and SIGTERM): an export removes its partial file.
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
		return paymentsList(ctx, args[1:], env, stdout, stderr)
	case "get":
		return paymentsGet(ctx, args[1:], env, stdout, stderr)
	case "resolve":
		return paymentsResolve(ctx, args[1:], env, stdin, stdout, stderr)
	case "export":
		return paymentsExport(ctx, args[1:], env, stdout, stderr)
	}
	io.WriteString(stderr, paymentsUsage)
	return usageError("payments: unknown command %q", args[0])
}

// connFlags are the flags every command takes to reach paymentsd: the same
// mTLS files a calling service uses.
type connFlags struct {
	addr, caFile, certFile, keyFile, serverName string
	insecure                                    bool
	timeout                                     time.Duration
}

func (c *connFlags) register(fs *flag.FlagSet, env func(string) string) {
	addr := env(envCLIAddr)
	if addr == "" {
		addr = "localhost:9090"
	}
	fs.StringVar(&c.addr, "addr", addr, "paymentsd's gRPC address, host:port ($"+envCLIAddr+")")
	fs.StringVar(&c.caFile, "tls-ca", env(envCLICA), "PEM CA certificates to verify paymentsd's certificate; empty: the system's ($"+envCLICA+")")
	fs.StringVar(&c.certFile, "tls-cert", env(envCLICert), "PEM client certificate: your identity ($"+envCLICert+")")
	fs.StringVar(&c.keyFile, "tls-key", env(envCLIKey), "PEM private key of --tls-cert ($"+envCLIKey+")")
	fs.StringVar(&c.serverName, "server-name", env(envCLIServerName), "name to verify paymentsd's certificate against; empty: --addr's host ($"+envCLIServerName+")")
	fs.BoolVar(&c.insecure, "insecure", false, "plaintext, no TLS: only for a paymentsd without TLS, such as --simulate")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of each call to paymentsd")
}

// dial connects to paymentsd; grpc.NewClient connects on the first call.
func (c *connFlags) dial() (paymentsv1.PaymentsServiceClient, func(), error) {
	if err := checkAddr(c.addr); err != nil {
		return nil, nil, err
	}
	var creds credentials.TransportCredentials
	var certAsked atomic.Bool
	if c.insecure {
		if c.caFile != "" || c.certFile != "" || c.keyFile != "" {
			return nil, nil, usageError("--insecure is plaintext: it can't be used with --tls-ca, --tls-cert or --tls-key")
		}
		creds = insecure.NewCredentials()
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName}
		if c.caFile != "" {
			pem, err := os.ReadFile(c.caFile)
			if err != nil {
				return nil, nil, usageError("--tls-ca: %w", config.FileError(err))
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, nil, usageError("--tls-ca: %s holds no PEM certificates", c.caFile)
			}
		}
		switch {
		case c.certFile != "" && c.keyFile != "":
			cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
			if err != nil {
				return nil, nil, usageError("--tls-cert, --tls-key: %w", config.FileError(err))
			}
			tc.Certificates = []tls.Certificate{cert}
		case c.certFile != "" || c.keyFile != "":
			return nil, nil, usageError("--tls-cert and --tls-key go together: give both or neither")
		default:
			// With no certificate of its own to give, note whether
			// paymentsd asks for one: an mTLS paymentsd then ends the
			// handshake, which the call sees as UNAVAILABLE.
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				certAsked.Store(true)
				return &tls.Certificate{}, nil
			}
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(creds),
		// An export page is at most 3 MiB; leave room for a larger one.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
		grpc.WithChainUnaryInterceptor(noIdentity(&certAsked), c.connectionErrors))
	if err != nil {
		return nil, nil, usageError("--addr %q: %w", c.addr, err)
	}
	return paymentsv1.NewPaymentsServiceClient(conn), func() { conn.Close() }, nil
}

// grpcSchemes are the gRPC target schemes --addr may use besides
// host:port.
var grpcSchemes = []string{"dns", "unix", "unix-abstract", "passthrough"}

// checkAddr refuses an --addr that is not host:port or a gRPC target
// (dns:///host:port, unix:path): grpc-go would take "http://host:port" or
// "host" for a DNS name and fail only at the first call, in its own words
// ("too many colons in address", or a connection to port 443).
func checkAddr(addr string) error {
	if scheme, _, ok := strings.Cut(addr, ":"); ok && slices.Contains(grpcSchemes, scheme) {
		return nil
	}
	if strings.Contains(addr, "://") {
		return usageError("--addr %q: give paymentsd's gRPC address as host:port (localhost:9090), not a URL; plaintext is --insecure", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
		return usageError("--addr %q: want host:port, paymentsd's gRPC address (localhost:9090)", addr)
	}
	return nil
}

// connectionErrors turns grpc-go's words for a call that never reached
// paymentsd's gRPC port into what is wrong and what to change, naming the
// address; the transport's own message follows in parentheses.
func (c *connFlags) connectionErrors(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.Unavailable && st.Code() != codes.Unimplemented) {
		return err
	}
	msg := st.Message()
	var what string
	switch {
	case strings.Contains(msg, "tls: first record does not look like a TLS handshake"):
		what = fmt.Sprintf("%s does not speak TLS: for a plaintext paymentsd (--simulate, say) add --insecure", c.addr)
	case strings.Contains(msg, "frame too large"),
		st.Code() == codes.Unimplemented && strings.HasPrefix(msg, "unexpected HTTP status code received from server"):
		what = fmt.Sprintf("%s answered as an HTTP server, not gRPC: is it paymentsd's REST port? --addr takes paymentsd's gRPC port (9090 by default)", c.addr)
	case strings.Contains(msg, "produced zero addresses"), strings.Contains(msg, "no such host"):
		what = fmt.Sprintf("host %q not found: check --addr", addrHost(c.addr))
	case strings.Contains(msg, "connection refused"):
		what = fmt.Sprintf("nothing is listening at %s: is paymentsd running there, and is --addr its gRPC port?", c.addr)
	case strings.Contains(msg, "x509: "):
		what = fmt.Sprintf("paymentsd's certificate at %s is not trusted: give the CA that signed it with --tls-ca, or the name it was issued for with --server-name", c.addr)
	case c.insecure && strings.Contains(msg, "error reading server preface: EOF"):
		what = fmt.Sprintf("%s closed the connection at once: if it serves TLS, drop --insecure; else check --addr", c.addr)
	default:
		return err
	}
	return status.Errorf(st.Code(), "%s (%s)", what, msg)
}

// addrHost is the host of --addr.
func addrHost(addr string) string {
	addr = strings.TrimPrefix(addr, "dns:///")
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// noIdentity turns a call that failed because paymentsd asked for a client
// certificate and was given none (asked says it did) into
// UNAUTHENTICATED, so that the CLI exits 3, not allowed, and says what to
// give, rather than 1, unreachable.
func noIdentity(asked *atomic.Bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Unavailable && asked.Load() {
			return status.Error(codes.Unauthenticated, "paymentsd asks for a client certificate, your identity, and none was given: give --tls-cert and --tls-key ($"+envCLICert+", $"+envCLIKey+")")
		}
		return err
	}
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
// set, with the flags that reach paymentsd among them.
type verb struct {
	fs     *flag.FlagSet
	conn   connFlags
	stdout io.Writer
}

// newVerb makes the command name's flag set (see newFlagSet) and registers
// the connection flags on it; the command adds its own before parse.
func newVerb(name, text string, env func(string) string, stdout, stderr io.Writer) *verb {
	v := &verb{fs: newFlagSet(name, text, stdout, stderr), stdout: stdout}
	v.conn.register(v.fs, env)
	return v
}

// parse parses args as parseArgs does and returns the positional
// arguments. ok is false when the command is done: --help was asked for
// and printed (err is nil), or the flags are wrong (err says how).
func (v *verb) parse(args []string) (rest []string, ok bool, err error) {
	rest, err = parseArgs(v.fs, args, v.stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil, false, nil
	}
	return rest, err == nil, err
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
			return nil, &exitError{exitUsage, err}
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

// outputFormat reads -o.
func outputFormat(o string) (json bool, err error) {
	switch o {
	case "", "table":
		return false, nil
	case "json":
		return true, nil
	}
	return false, usageError("-o %q: want table or json", o)
}

// parseState reads a state as outcome_unknown, OUTCOME_UNKNOWN or
// PAYMENT_STATE_OUTCOME_UNKNOWN.
func parseState(s string) (paymentsv1.PaymentState, error) {
	name := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	if !strings.HasPrefix(name, "PAYMENT_STATE_") {
		name = "PAYMENT_STATE_" + name
	}
	v, ok := paymentsv1.PaymentState_value[name]
	if !ok || v == 0 {
		return 0, usageError("--state %q: want in_progress, succeeded, not_created or outcome_unknown", s)
	}
	return paymentsv1.PaymentState(v), nil
}

// stateName is a state as the CLI shows it: outcome_unknown.
func stateName(s paymentsv1.PaymentState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "PAYMENT_STATE_"))
}

// parseTime reads a time given as RFC 3339, a date (YYYY-MM-DD, a UTC day),
// "today" or "yesterday" (UTC). A day stands for its start, or, with end,
// for the start of the next day, so that --to 2026-11-23 includes that day.
func parseTime(flagName, s string, now time.Time, end bool) (time.Time, error) {
	day := func(d time.Time) time.Time {
		if end {
			d = d.AddDate(0, 0, 1)
		}
		return d
	}
	today := now.UTC().Truncate(24 * time.Hour)
	switch s {
	case "today":
		return day(today), nil
	case "yesterday":
		return day(today.AddDate(0, 0, -1)), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.Parse(time.DateOnly, s); err == nil {
		return day(d), nil
	}
	return time.Time{}, usageError("%s %q: want RFC 3339 (2026-11-23T09:00:00Z), a UTC date (2026-11-23), today or yesterday", flagName, s)
}

// filterFlags are list's and export's filters.
type filterFlags struct {
	states          []string
	inDoubt, gaveUp bool
	from, to        string
	caller          string
}

func (f *filterFlags) register(fs *flag.FlagSet, fromName, toName string) {
	fs.Func("state", "only this state: in_progress, succeeded, not_created, outcome_unknown (repeatable)", func(s string) error {
		f.states = append(f.states, s)
		return nil
	})
	fs.BoolVar(&f.inDoubt, "in-doubt", false, "only payments in doubt: outcome_unknown, inside their settlement window or past it")
	fs.BoolVar(&f.gaveUp, "gave-up", false, "only payments whose settlement gave up (counted by paymentsd_records_unsettled)")
	fs.StringVar(&f.from, fromName, "", "only payments created at or after: RFC 3339, a UTC date (YYYY-MM-DD), today or yesterday")
	fs.StringVar(&f.to, toName, "", "only payments created before: RFC 3339, or through the end of a UTC date, today or yesterday")
	fs.StringVar(&f.caller, "caller", "", "only payments created by this caller identity")
}

func (f *filterFlags) request(fromName, toName string, now time.Time) (*paymentsv1.ListMultiCardPaymentsRequest, error) {
	req := &paymentsv1.ListMultiCardPaymentsRequest{Caller: f.caller}
	for _, s := range f.states {
		st, err := parseState(s)
		if err != nil {
			return nil, err
		}
		req.State = append(req.State, st)
	}
	if f.inDoubt || f.gaveUp {
		if len(req.State) > 0 && !slices.Equal(req.State, []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN}) {
			return nil, usageError("--in-doubt and --gave-up select outcome_unknown payments: drop --state")
		}
		req.State = []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN}
	}
	if f.gaveUp {
		req.SettlementGaveUp = proto.Bool(true)
	}
	if f.from != "" {
		t, err := parseTime("--"+fromName, f.from, now, false)
		if err != nil {
			return nil, err
		}
		req.CreatedAfter = timestamppb.New(t)
	}
	if f.to != "" {
		t, err := parseTime("--"+toName, f.to, now, true)
		if err != nil {
			return nil, err
		}
		req.CreatedBefore = timestamppb.New(t)
	}
	if req.CreatedAfter != nil && req.CreatedBefore != nil && !req.CreatedAfter.AsTime().Before(req.CreatedBefore.AsTime()) {
		return nil, usageError("--%s %s is not before --%s %s", fromName, f.from, toName, f.to)
	}
	return req, nil
}

const listText = `Usage: paymentsd payments list [flags]

List payments, oldest first, as a table (or JSON lines with -o json: one
payments.v1.MultiCardPaymentSummary per line, as the REST API writes it).
At 3 a.m.: 'paymentsd payments list --in-doubt' lists every payment whose
outcome is unknown; --gave-up only those paymentsd_records_unsettled counts.
`

func paymentsList(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	var filters filterFlags
	v := newVerb("list", listText, env, stdout, stderr)
	filters.register(v.fs, "created-after", "created-before")
	output := v.fs.String("o", "table", "output: table or json (JSON lines)")
	limit := v.fs.Int("limit", 500, "at most this many payments; 0 for all")
	rest, ok, err := v.parse(args)
	if !ok {
		return err
	}
	if len(rest) > 0 {
		return usageError("list takes no arguments, got %q", rest)
	}
	asJSON, err := outputFormat(*output)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usageError("--limit %d: want 0 (all) or more", *limit)
	}
	req, err := filters.request("created-after", "created-before", time.Now())
	if err != nil {
		return err
	}
	client, closeConn, err := v.conn.dial()
	if err != nil {
		return err
	}
	defer closeConn()

	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var table *tabwriter.Writer
	if !asJSON {
		table = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(table, "KEY\tSTATE\tAMOUNT\tCALLER\tCREATED (UTC)\tATTEMPTS\tPROVIDER\tNOTE")
	}
	shown, more := 0, false
	for {
		if *limit > 0 {
			req.PageSize = int32(min(1000, *limit-shown+1)) // one more tells whether there are more
		} else {
			req.PageSize = 1000
		}
		callCtx, cancel := context.WithTimeout(ctx, v.conn.timeout)
		page, err := client.ListMultiCardPayments(callCtx, req)
		cancel()
		if err != nil {
			return callError("list", err)
		}
		for _, p := range page.GetPayments() {
			if *limit > 0 && shown == *limit {
				more = true
				break
			}
			shown++
			if asJSON {
				b, err := service.RESTJSON(p)
				if err != nil {
					return err
				}
				w.Write(b)
				w.WriteByte('\n')
				continue
			}
			fmt.Fprintf(table, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", printable(p.GetIdempotencyKey()), stateName(p.GetState()),
				amount(p.GetAmountMoney()), dash(printable(p.GetCaller())), timeText(p.GetCreateTime()), p.GetAttempts(),
				providerStatusText(p.GetProviderHttpStatus()), note(p))
		}
		if more || page.GetNextPageToken() == "" {
			break
		}
		req.PageToken = page.GetNextPageToken()
	}
	if table != nil {
		table.Flush()
	}
	switch {
	case more:
		fmt.Fprintf(stderr, "%d payments shown; there are more: narrow the filters or raise --limit (0 for all)\n", shown)
	case shown == 0:
		fmt.Fprintln(stderr, "no payments match")
	}
	return nil
}

// note is the table's last column: why a payment needs a person, or what
// one did.
func note(p *paymentsv1.MultiCardPaymentSummary) string {
	var notes []string
	if p.GetSettlementGaveUp() {
		notes = append(notes, "settlement gave up")
	} else if p.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		notes = append(notes, "settling until "+timeText(p.GetSettlementWindowEndTime()))
	}
	if p.GetResolved() {
		notes = append(notes, "resolved by a person")
	}
	if len(notes) == 0 {
		return "-"
	}
	return strings.Join(notes, "; ")
}

func amount(m *paymentsv1.Money) string {
	if m == nil {
		return "-"
	}
	return fmt.Sprintf("%d %s", m.GetAmount(), m.GetCurrency())
}

func providerStatusText(s int32) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprint(s)
}

func timeText(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable quotes s if it holds anything a terminal would act on, or
// whitespace that would break a table's columns.
func printable(s string) string {
	for _, r := range s {
		// strconv.IsPrint is false for control and format characters
		// (right-to-left overrides, zero-width spaces), line and paragraph
		// separators and spaces other than ' ', which %q escapes.
		if r == ' ' || r == utf8.RuneError || !strconv.IsPrint(r) {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}

const getText = `Usage: paymentsd payments get [flags] KEY

Show the payment whose idempotency key is KEY, its attempts (each call's
and each settlement re-send's: which replica, when, the provider's status
and reply exactly, and what was recorded), and its audit trail: who
resolved it, when, from and to which state, and with what evidence.
-o json prints payments.v1.GetMultiCardPaymentResponse as the REST API does.
`

func paymentsGet(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	v := newVerb("get", getText, env, stdout, stderr)
	output := v.fs.String("o", "table", "output: table or json")
	rest, ok, err := v.parse(args)
	if !ok {
		return err
	}
	if len(rest) != 1 {
		return usageError("get takes one idempotency key, got %d arguments", len(rest))
	}
	asJSON, err := outputFormat(*output)
	if err != nil {
		return err
	}
	client, closeConn, err := v.conn.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	callCtx, cancel := context.WithTimeout(ctx, v.conn.timeout)
	defer cancel()
	p, err := client.GetMultiCardPayment(callCtx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: rest[0]})
	if err != nil {
		return callError("get", err)
	}
	if asJSON {
		b, err := service.RESTJSON(p)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	return writePayment(stdout, rest[0], p)
}

// writePayment writes a record for a person to read.
func writePayment(stdout io.Writer, key string, p *paymentsv1.GetMultiCardPaymentResponse) error {
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	state := stateName(p.GetState())
	if p.GetSettlementGaveUp() {
		state += " (settlement gave up)"
	}
	fields := []struct{ name, value string }{
		{"Key", printable(key)},
		{"State", state},
		{"Amount", amount(p.GetRequest().GetAmountMoney())},
		{"Caller", dash(printable(p.GetCaller()))},
		{"Environment", strings.ToLower(strings.TrimPrefix(p.GetEnvironment().String(), "ENVIRONMENT_"))},
		{"Created (UTC)", timeText(p.GetCreateTime())},
		{"Updated (UTC)", timeText(p.GetUpdateTime())},
		{"Attempts", fmt.Sprint(p.GetAttempts())},
		{"Provider status", providerStatusText(p.GetProviderHttpStatus())},
		{"Last error", dash(printable(p.GetLastError()))},
		{"Settlement window ends", timeText(p.GetSettlementWindowEndTime())},
		{"Request ID", dash(printable(p.GetRequestId()))},
	}
	for _, f := range fields {
		fmt.Fprintf(w, "%s:\t%s\n", f.name, f.value)
	}
	if len(p.GetPaymentJson()) > 0 {
		fmt.Fprintf(w, "Provider reply:\t%s\n", printable(string(p.GetPaymentJson())))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := writeAttempts(stdout, p.GetAttemptHistory()); err != nil {
		return err
	}
	entries := p.GetAuditEntries()
	if len(entries) == 0 {
		_, err := io.WriteString(stdout, "\nAudit trail: none\n")
		return err
	}
	io.WriteString(stdout, "\nAudit trail:\n")
	w = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  WHEN (UTC)\tBY\tFROM\tTO\tREQUEST ID\tCALLER'S REQUEST ID\tEVIDENCE")
	for _, e := range entries {
		from := stateName(e.GetFromState())
		if e.GetSettlementGaveUp() {
			from += " (gave up)"
		}
		to := stateName(e.GetToState())
		if e.GetReplyRecorded() {
			to += " (reply recorded)"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", timeText(e.GetCreateTime()), printable(e.GetActor()), from, to,
			dash(printable(e.GetRequestId())), dash(printable(e.GetCallerRequestId())), printable(e.GetEvidence()))
	}
	return w.Flush()
}

// writeAttempts writes a record's attempts as a table: who made each,
// when, the provider's status, what was recorded, and the provider's
// reply exactly (or why it failed).
func writeAttempts(stdout io.Writer, attempts []*paymentsv1.PaymentAttempt) error {
	if len(attempts) == 0 {
		_, err := io.WriteString(stdout, "\nAttempts: none recorded\n")
		return err
	}
	io.WriteString(stdout, "\nAttempts:\n")
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  #\tBY\tREPLICA\tREQUEST ID\tSTARTED (UTC)\tENDED (UTC)\tPROVIDER\tOUTCOME\tREPLY OR ERROR")
	for _, a := range attempts {
		by := strings.ToLower(strings.TrimPrefix(a.GetKind().String(), "ATTEMPT_KIND_"))
		outcome := stateName(a.GetOutcome())
		switch {
		case a.GetInFlight():
			outcome = "in flight"
		case a.GetAbandoned():
			outcome += " (abandoned)"
		}
		ended := timeText(a.GetEndTime())
		detail := string(a.GetPaymentJson())
		if detail == "" || a.GetProviderHttpStatus() < 200 || a.GetProviderHttpStatus() > 299 {
			detail = strings.TrimSpace(a.GetError() + " " + detail)
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.GetNumber(), by, dash(printable(a.GetReplica())),
			dash(printable(a.GetRequestId())), timeText(a.GetStartTime()), ended, providerStatusText(a.GetProviderHttpStatus()),
			outcome, dash(printable(detail)))
	}
	return w.Flush()
}

const resolveText = `Usage: paymentsd payments resolve [flags] KEY --outcome succeeded|not-created

Record what you found out about a payment in doubt (outcome_unknown), for
example on the provider's dashboard:
  succeeded    the provider created it: later calls with the key replay it
               (with the reply given by --reply-file, if any).
  not-created  the provider certainly has no payment for it: the next call
               with the key makes a new attempt.
The evidence (what you saw, such as the provider's payment ID) is required:
give it with --evidence or type it when asked. resolve shows the payment and
asks you to confirm unless --yes is given. The change and its audit entry
are written together; 'paymentsd payments get KEY' shows them. While a
request with the key may still be at the provider, paymentsd changes
nothing (PAYMENT_IN_PROGRESS) and says how long to wait; --wait waits.
`

func paymentsResolve(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	v := newVerb("resolve", resolveText, env, stdout, stderr)
	outcomeFlag := v.fs.String("outcome", "", "succeeded or not-created (required)")
	evidence := v.fs.String("evidence", "", "what you saw, e.g. the provider dashboard's payment ID and status; asked for if not given")
	replyFile := v.fs.String("reply-file", "", "with succeeded: a file holding the provider's payment JSON, exactly as you got it")
	yes := v.fs.Bool("yes", false, "don't ask for confirmation")
	wait := v.fs.Duration("wait", 0, "while a request with the key may still be at the provider (PAYMENT_IN_PROGRESS), wait as paymentsd asks and try again, for up to this long; 0: don't wait")
	output := v.fs.String("o", "table", "output: table or json")
	rest, ok, err := v.parse(args)
	if !ok {
		return err
	}
	if len(rest) != 1 {
		return usageError("resolve takes one idempotency key, got %d arguments", len(rest))
	}
	key := rest[0]
	asJSON, err := outputFormat(*output)
	if err != nil {
		return err
	}
	req := &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: key}
	var meaning string
	switch strings.ToLower(strings.ReplaceAll(*outcomeFlag, "_", "-")) {
	case "succeeded":
		req.Outcome = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED
		meaning = "the provider created it; later calls with the key replay it"
	case "not-created":
		req.Outcome = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED
		meaning = "the provider has no payment for it; the next call with the key makes a new attempt"
	case "":
		return usageError("--outcome is required: succeeded or not-created")
	default:
		return usageError("--outcome %q: want succeeded or not-created", *outcomeFlag)
	}
	if *replyFile != "" {
		if req.Outcome != paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED {
			return usageError("--reply-file goes with --outcome succeeded only")
		}
		b, err := os.ReadFile(*replyFile)
		if err != nil {
			return usageError("--reply-file: %w", config.FileError(err))
		}
		req.ReplyJson = string(b)
	}
	client, closeConn, err := v.conn.dial()
	if err != nil {
		return err
	}
	defer closeConn()

	// Show what is about to change before asking anything.
	callCtx, cancel := context.WithTimeout(ctx, v.conn.timeout)
	current, err := client.GetMultiCardPayment(callCtx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	cancel()
	if err != nil {
		return callError("resolve: get the payment", err)
	}
	if current.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		return &exitError{exitRefused, fmt.Errorf("resolve: %s is %s, not outcome_unknown: only a payment in doubt can be resolved; nothing changed",
			printable(key), stateName(current.GetState()))}
	}
	// If a retry or settlement sends the key while the person reads the
	// dashboard and types, what they saw may be out of date: paymentsd
	// then changes nothing (RECORD_CHANGED).
	req.ExpectedUpdateTime = current.GetUpdateTime()
	fmt.Fprintf(stderr, "Payment %s: %s, %s, created %s UTC by %s, %d attempt(s), last error: %s\n",
		printable(key), stateName(current.GetState()), amount(current.GetRequest().GetAmountMoney()), timeText(current.GetCreateTime()),
		dash(printable(current.GetCaller())), current.GetAttempts(), dash(printable(current.GetLastError())))

	in := bufio.NewReader(stdin)
	req.Evidence = *evidence
	if blank(req.Evidence) && *evidence == "" {
		fmt.Fprint(stderr, "Evidence: what did you see, and where (for example the provider dashboard's payment ID and status)?\n"+
			"End with an empty line.\n> ")
		req.Evidence, err = readParagraph(in, stderr)
		if err != nil {
			return err
		}
	}
	if blank(req.Evidence) {
		return usageError("resolve: the evidence is blank or invisible: say what you saw, and where; nothing changed")
	}
	if !*yes {
		fmt.Fprintf(stderr, "Resolve %s as %s: %s.\nEvidence: %s\nProceed? [y/N] ",
			printable(key), strings.ToUpper(strings.ReplaceAll(*outcomeFlag, "-", "_")), meaning, req.Evidence)
		answer, err := in.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return &exitError{exitDeclined, errors.New("resolve: not confirmed; nothing changed (--yes skips the question)")}
		}
	}
	resp, err := resolveWaiting(ctx, client, req, v.conn.timeout, *wait, stderr)
	if err != nil {
		if status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			return fmt.Errorf("%w (the resolution may or may not have been recorded: 'paymentsd payments get' shows which)", callError("resolve", err))
		}
		return callError("resolve", err)
	}
	fmt.Fprintf(stderr, "Resolved %s: %s -> %s.\n", printable(key), stateName(resp.GetAuditEntry().GetFromState()), stateName(resp.GetAuditEntry().GetToState()))
	if asJSON {
		b, err := service.RESTJSON(resp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	return writePayment(stdout, key, resp.GetPayment())
}

// resolveWaiting resolves req, and while paymentsd answers
// PAYMENT_IN_PROGRESS (a request with the key is being sent, or may still
// be at the provider) waits the RetryInfo's delay and asks again, for up
// to wait. The request keeps its expected_update_time: if a request did
// change the record meanwhile, paymentsd says RECORD_CHANGED and nothing
// is resolved.
func resolveWaiting(ctx context.Context, client paymentsv1.PaymentsServiceClient, req *paymentsv1.ResolveMultiCardPaymentRequest, timeout, wait time.Duration, stderr io.Writer) (*paymentsv1.ResolveMultiCardPaymentResponse, error) {
	deadline := time.Now().Add(wait)
	for {
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := client.ResolveMultiCardPayment(callCtx, req)
		cancel()
		delay := retryDelayOf(err)
		if err == nil || status.Code(err) != codes.Aborted || delay <= 0 || time.Now().Add(delay).After(deadline) {
			return resp, err
		}
		fmt.Fprintf(stderr, "A request with the key may still be at the provider; trying again in %v.\n", delay.Round(100*time.Millisecond))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// blank reports whether s has nothing a person can read: only separators
// (Unicode category Z: spaces such as U+00A0 and U+3000) and invisible
// characters (category C: controls, and format characters such as
// U+200B), as paymentsd's own rule for evidence has it.
func blank(s string) bool {
	for _, r := range s {
		if !unicode.In(r, unicode.Z, unicode.C) {
			return false
		}
	}
	return true
}

// readParagraph reads lines until an empty line or the end of input.
func readParagraph(in *bufio.Reader, prompt io.Writer) (string, error) {
	var lines []string
	for {
		line, err := in.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		lines = append(lines, line)
		if errors.Is(err, io.EOF) {
			break
		}
		fmt.Fprint(prompt, "> ")
	}
	return strings.Join(lines, "\n"), nil
}
