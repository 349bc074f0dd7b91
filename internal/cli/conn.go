package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
)

// The CLI's environment variables, each the default of a flag. paymentsd
// itself ignores them (see ignoredVariables in internal/config).
const (
	envCLIAddr       = "PAYMENTS_CLI_ADDR"
	envCLICA         = "PAYMENTS_CLI_TLS_CA_FILE"
	envCLICert       = "PAYMENTS_CLI_TLS_CERT_FILE"
	envCLIKey        = "PAYMENTS_CLI_TLS_KEY_FILE"
	envCLIServerName = "PAYMENTS_CLI_SERVER_NAME"
)

// ConnFlags are the flags every command takes to reach paymentsd: the same
// mTLS files a calling service uses.
type ConnFlags struct {
	Addr                                  string        // --addr, host:port or a gRPC target
	CAFile, CertFile, KeyFile, ServerName string        // --tls-ca, --tls-cert, --tls-key, --server-name
	Insecure                              bool          // --insecure: plaintext
	Timeout                               time.Duration // --timeout: of each call
}

// register registers the flags on fs, each defaulting to its PAYMENTS_CLI_*
// variable as env gives it.
func (c *ConnFlags) register(fs *flag.FlagSet, env func(string) string) {
	addr := env(envCLIAddr)
	if addr == "" {
		addr = "localhost:9090"
	}
	fs.StringVar(&c.Addr, "addr", addr, "paymentsd's gRPC address, host:port ($"+envCLIAddr+")")
	fs.StringVar(&c.CAFile, "tls-ca", env(envCLICA), "PEM CA certificates to verify paymentsd's certificate; empty: the system's ($"+envCLICA+")")
	fs.StringVar(&c.CertFile, "tls-cert", env(envCLICert), "PEM client certificate: your identity ($"+envCLICert+")")
	fs.StringVar(&c.KeyFile, "tls-key", env(envCLIKey), "PEM private key of --tls-cert ($"+envCLIKey+")")
	fs.StringVar(&c.ServerName, "server-name", env(envCLIServerName), "name to verify paymentsd's certificate against; empty: --addr's host ($"+envCLIServerName+")")
	fs.BoolVar(&c.Insecure, "insecure", false, "plaintext, no TLS: only for a paymentsd without TLS, such as --simulate")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "deadline of each call to paymentsd")
}

// Dial connects to paymentsd; grpc.NewClient connects on the first call.
// The function it returns closes the connection.
func (c *ConnFlags) Dial() (paymentsv1.PaymentsServiceClient, func(), error) {
	if err := checkAddr(c.Addr); err != nil {
		return nil, nil, err
	}
	var creds credentials.TransportCredentials
	var certAsked atomic.Bool
	if c.Insecure {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			return nil, nil, usageError("--insecure is plaintext: it can't be used with --tls-ca, --tls-cert or --tls-key")
		}
		creds = insecure.NewCredentials()
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, nil, usageError("--tls-ca: %w", config.FileError(err))
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, nil, usageError("--tls-ca: %s holds no PEM certificates", c.CAFile)
			}
		}
		switch {
		case c.CertFile != "" && c.KeyFile != "":
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, nil, usageError("--tls-cert, --tls-key: %w", config.FileError(err))
			}
			tc.Certificates = []tls.Certificate{cert}
		case c.CertFile != "" || c.KeyFile != "":
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
	conn, err := grpc.NewClient(c.Addr, grpc.WithTransportCredentials(creds),
		// An export page is at most 3 MiB; leave room for a larger one.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
		grpc.WithChainUnaryInterceptor(noIdentity(&certAsked), c.connectionErrors))
	if err != nil {
		return nil, nil, usageError("--addr %q: %w", c.Addr, err)
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
func (c *ConnFlags) connectionErrors(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.Unavailable && st.Code() != codes.Unimplemented) {
		return err
	}
	msg := st.Message()
	var what string
	switch {
	case strings.Contains(msg, "tls: first record does not look like a TLS handshake"):
		what = fmt.Sprintf("%s does not speak TLS: for a plaintext paymentsd (--simulate, say) add --insecure", c.Addr)
	case strings.Contains(msg, "frame too large"),
		st.Code() == codes.Unimplemented && strings.HasPrefix(msg, "unexpected HTTP status code received from server"):
		what = fmt.Sprintf("%s answered as an HTTP server, not gRPC: is it paymentsd's REST port? --addr takes paymentsd's gRPC port (9090 by default)", c.Addr)
	case strings.Contains(msg, "produced zero addresses"), strings.Contains(msg, "no such host"):
		what = fmt.Sprintf("host %q not found: check --addr", addrHost(c.Addr))
	case strings.Contains(msg, "connection refused"):
		what = fmt.Sprintf("nothing is listening at %s: is paymentsd running there, and is --addr its gRPC port?", c.Addr)
	case strings.Contains(msg, "x509: "):
		what = fmt.Sprintf("paymentsd's certificate at %s is not trusted: give the CA that signed it with --tls-ca, or the name it was issued for with --server-name", c.Addr)
	case c.Insecure && strings.Contains(msg, "error reading server preface: EOF"):
		what = fmt.Sprintf("%s closed the connection at once: if it serves TLS, drop --insecure; else check --addr", c.Addr)
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
