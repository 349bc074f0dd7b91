package paymentsclient

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
)

// DefaultNotReachedTimeout is how long Create and Get go on trying, by
// default, while a Client has never reached paymentsd and its attempts
// find no connection.
const DefaultNotReachedTimeout = 10 * time.Second

// WithNotReachedTimeout sets how long Create and Get go on trying while
// this Client has never reached a paymentsd and every attempt fails before
// it has a connection (nothing listening at the address, a name that does
// not resolve): paymentsd may be starting, or the address may be wrong.
// Past it they return ErrNotReached. Zero means until the context's
// deadline, as for a Client that has reached paymentsd before, whose
// failed connections are an outage, not a configuration error.
func WithNotReachedTimeout(d time.Duration) Option {
	return func(c *Client) { c.notReachedTimeout = d }
}

// reach is where an attempt that failed went.
type reach int

const (
	// reachedPaymentsd: a gRPC server answered for PaymentsService, or
	// the attempt went out on a connection and may have reached one.
	reachedPaymentsd reach = iota
	// notConnected: the attempt failed before it had a connection, so it
	// never left this process. Retrying may help (paymentsd starting).
	notConnected
	// notPaymentsd: what the attempt met is certainly not paymentsd's
	// gRPC port, and retrying can't change that.
	notPaymentsd
)

// httpStatus reads the HTTP status of an answer from a server that does
// not speak gRPC, as grpc-go reports it.
var httpStatus = regexp.MustCompile(`^unexpected HTTP status code received from server: (\d{3}) `)

// misconfigured are what grpc-go says of a connection whose handshake
// showed that the other end is not paymentsd's gRPC port as the client is
// set up to speak to it: an HTTP/1 server (paymentsd's REST port in
// plaintext), a plaintext server to a client speaking TLS, a certificate
// the client does not trust, or a server that refused the client's. A
// handshake that merely ended (EOF: a server over its connection cap, a
// restart) is not among them.
var misconfigured = []string{
	"frame too large",
	"tls: first record does not look like a TLS handshake",
	"x509: ",
	"remote error: tls: ",
}

// reachOf says where an attempt that failed with a went, at being the
// peer it was sent to (nil Addr: it had no connection).
func reachOf(a answer, at peer.Peer) reach {
	msg := a.st.Message()
	if at.Addr == nil {
		for _, m := range misconfigured {
			if strings.Contains(msg, m) {
				return notPaymentsd
			}
		}
		return notConnected
	}
	if a.reason != "" {
		return reachedPaymentsd
	}
	// paymentsd serves every PaymentsService method: UNIMPLEMENTED with
	// no reason is a gRPC server that doesn't (or an HTTP server's 404).
	if a.st.Code() == codes.Unimplemented {
		return notPaymentsd
	}
	// A server that does not speak gRPC refused the request itself. A
	// proxy's 408, 429 or 5xx may come after it passed the request on.
	if m := httpStatus.FindStringSubmatch(msg); m != nil {
		if s, _ := strconv.Atoi(m[1]); s >= 400 && s < 500 && s != 408 && s != 429 {
			return notPaymentsd
		}
	}
	return reachedPaymentsd
}
