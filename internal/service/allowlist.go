package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// ReasonCallerNotAllowed is the ErrorInfo reason of PERMISSION_DENIED for
// a caller whose identity is not in the allowlist, or, when client
// certificates are required, whose certificate names no identity (see
// Identity; the ErrorInfo metadata "problem" then says why). Existing
// callers already stop on it: nothing was sent.
const ReasonCallerNotAllowed = "CALLER_NOT_ALLOWED"

// CallerAttribute is the server span attribute that carries the caller's
// identity.
const CallerAttribute = "paymentsd.caller"

// caller is what the connection says of who is calling.
type caller struct {
	// id is the identity its certificate names; zero if it names none, or
	// the connection carried no certificate.
	id Identity
	// problem says why a certificate names no identity; nil when id is
	// set or there was no certificate.
	problem error
	// chains are the certificate's chains to a client CA, as verified
	// when the connection opened; none without client CAs.
	chains [][]*x509.Certificate
}

func callerFromTLS(state *tls.ConnectionState) *caller {
	id, err := certIdentity(state.PeerCertificates[0])
	return &caller{id: id, problem: err, chains: state.VerifiedChains}
}

// CallerFromContext returns the identity of the caller of the call whose
// context ctx is, as Identity.String writes it: the SPIFFE ID of its mTLS
// client certificate, or dns: and its DNS name; "" when the connection
// carried no client certificate, or one that names no identity.
func CallerFromContext(ctx context.Context) string {
	c := identityOf(ctx)
	if c == nil || c.id.IsZero() {
		return ""
	}
	return c.id.String()
}

// identifyHTTP puts the REST caller's certificate identity in the request's
// httpCall (it must run inside withRequestID): the gateway calls the
// service in-process with the request's context, so the interceptors see
// it as they see a gRPC peer's.
func identifyHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := httpCallOf(r.Context()); c != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			c.caller = callerFromTLS(r.TLS)
		}
		next.ServeHTTP(w, r)
	})
}

// identityOf returns what is known of the caller: the call's, once the
// unary chain or streamRequestID has read it (callInfo); a request's on
// the HTTP port, set by identifyHTTP; or read from the gRPC peer's
// verified certificate; nil without a certificate.
func identityOf(ctx context.Context) *caller {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		return ci.caller
	}
	if c := httpCallOf(ctx); c != nil {
		return c.caller
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return nil
	}
	return callerFromTLS(&tlsInfo.State)
}

// gate admits callers to everything but health checks and reflection.
// With requireIdentity (mTLS), a caller must have an identity, from a
// certificate that is still trusted; with an allowlist, it must be in it,
// or have a role that admits it to the method called.
type gate struct {
	requireIdentity bool
	// allowed, if not nil, are the only identities admitted to every
	// method.
	allowed identitySet
	// admins not in allowed are admitted to every method but
	// CreateMultiCardPayment; readers not in allowed, to
	// ProviderEventsService only.
	admins, readers identitySet
	// stillTrusted, if set, says whether certificate chains verified when
	// their connection opened would still be.
	stillTrusted func(verifiedChains [][]*x509.Certificate) error
	// clock is what open streams wait on for their callers' certificates
	// to expire; trustChanged, if set, returns a channel closed the next
	// time the client CAs change (see Options).
	clock        Clock
	trustChanged func() <-chan struct{}
	// env is the environment served, which refusals name.
	env paymentsv1.Environment
}

func (g gate) check(ctx context.Context, fullMethod string) error {
	if openMethod(fullMethod) || (!g.requireIdentity && g.allowed == nil) {
		return nil
	}
	return g.checkCaller(identityOf(ctx), fullMethod)
}

// checkCaller says whether c may call fullMethod, a method that is not
// open to all.
func (g gate) checkCaller(c *caller, fullMethod string) error {
	if c != nil && len(c.chains) > 0 && g.stillTrusted != nil {
		// A connection outlives the certificate it was opened with (a
		// REST one for as long as it is used), and the client CA file
		// is re-read under it: an expired certificate, or one whose CA
		// was removed, names nobody any longer.
		if err := g.stillTrusted(c.chains); err != nil {
			msg := "this caller's client certificate is no longer trusted (" + err.Error() + "); this call sent nothing to the provider: connect again with a current certificate"
			st := status.New(codes.PermissionDenied, msg)
			return withDetails(st, g.notAllowed(map[string]string{"problem": err.Error()}))
		}
	}
	if c == nil || c.id.IsZero() {
		msg := "this call came without a client certificate that names a caller identity; this call sent nothing to the provider"
		md := map[string]string{}
		if c != nil && c.problem != nil {
			msg = "this caller's client certificate names no identity paymentsd accepts (" + c.problem.Error() + "); this call sent nothing to the provider: present a certificate whose one URI SAN is the caller's SPIFFE ID (or, without a URI SAN, whose one DNS SAN is its name)"
			md["problem"] = c.problem.Error()
		}
		st := status.New(codes.PermissionDenied, msg)
		return withDetails(st, g.notAllowed(md))
	}
	if g.allowed == nil || g.allowed.has(c.id) || g.admits(c.id, fullMethod) {
		return nil
	}
	msg := "this caller's identity may not call paymentsd; this call sent nothing to the provider: ask the payments team to add the caller's SPIFFE ID (or dns:name) to PAYMENTS_ALLOWED_CALLERS"
	switch {
	case g.admins.has(c.id):
		msg = "this caller's identity is an admin, which lists, looks up and resolves payments but takes none; this call sent nothing to the provider: a caller that pays must be in PAYMENTS_ALLOWED_CALLERS"
	case g.readers.has(c.id):
		msg = "this caller's identity is an event reader, which reads provider events and nothing else; this call sent nothing to the provider: a caller that pays or looks payments up must be in PAYMENTS_ALLOWED_CALLERS"
	}
	st := status.New(codes.PermissionDenied, msg)
	return withDetails(st, g.notAllowed(map[string]string{"caller": c.id.String()}))
}

// notAllowed is CALLER_NOT_ALLOWED's ErrorInfo, with md and, as every
// reason's, the environment.
func (g gate) notAllowed(md map[string]string) *errdetails.ErrorInfo {
	md["environment"] = envName(g.env)
	return &errdetails.ErrorInfo{Reason: ReasonCallerNotAllowed, Domain: ErrorDomain, Metadata: md}
}

// admits reports whether id's role, admin or event reader, admits it to
// fullMethod: an admin to all but taking payments, an event reader to the
// provider's events only.
func (g gate) admits(id Identity, fullMethod string) bool {
	switch {
	case g.admins.has(id):
		return fullMethod != paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName
	case g.readers.has(id):
		return strings.HasPrefix(fullMethod, "/"+paymentsv1.ProviderEventsService_ServiceDesc.ServiceName+"/")
	}
	return false
}

func (g gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	c := identityOf(ss.Context())
	if openMethod(info.FullMethod) || c == nil || len(c.chains) == 0 || g.stillTrusted == nil {
		// Nothing it was admitted on can change while it is open.
		return handler(srv, ss)
	}
	return g.recheckedStream(srv, ss, c, info.FullMethod, handler)
}
