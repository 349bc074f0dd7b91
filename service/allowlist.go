package service

import (
	"context"
	"crypto/x509"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
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
}

type identityKey struct{}

func callerFromCert(cert *x509.Certificate) *caller {
	id, err := certIdentity(cert)
	return &caller{id: id, problem: err}
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
// context: the gateway calls the service in-process with that context, so
// the interceptors see it as they see a gRPC peer's.
func identifyHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			r = r.WithContext(context.WithValue(r.Context(), identityKey{}, callerFromCert(r.TLS.PeerCertificates[0])))
		}
		next.ServeHTTP(w, r)
	})
}

// identityOf returns what is known of the caller: set by identifyHTTP for
// REST and by identify for unary gRPC calls, or read from the gRPC peer's
// verified certificate; nil without a certificate.
func identityOf(ctx context.Context) *caller {
	if c, ok := ctx.Value(identityKey{}).(*caller); ok {
		return c
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return nil
	}
	return callerFromCert(tlsInfo.State.PeerCertificates[0])
}

// identify puts the caller's identity in the context, for the access log,
// CallerFromContext and the server span.
func identify(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := identityOf(ctx)
	if c == nil {
		return handler(ctx, req)
	}
	if !c.id.IsZero() {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(CallerAttribute, c.id.String()))
	}
	return handler(context.WithValue(ctx, identityKey{}, c), req)
}

// gate admits callers to everything but health checks and reflection.
// With requireIdentity (mTLS), a caller must have an identity; with an
// allowlist, it must be in it.
type gate struct {
	requireIdentity bool
	// allowed, if not nil, are the only identities admitted.
	allowed identitySet
}

func (g gate) check(ctx context.Context, fullMethod string) error {
	if openMethod(fullMethod) || (!g.requireIdentity && g.allowed == nil) {
		return nil
	}
	c := identityOf(ctx)
	if c == nil || c.id.IsZero() {
		msg := "this call came without a client certificate that names a caller identity; this call sent nothing to the provider"
		md := map[string]string{}
		if c != nil && c.problem != nil {
			msg = "this caller's client certificate names no identity paymentsd accepts (" + c.problem.Error() + "); this call sent nothing to the provider: present a certificate whose one URI SAN is the caller's SPIFFE ID (or, without a URI SAN, whose one DNS SAN is its name)"
			md["problem"] = c.problem.Error()
		}
		st := status.New(codes.PermissionDenied, msg)
		return withDetails(st, &errdetails.ErrorInfo{Reason: ReasonCallerNotAllowed, Domain: ErrorDomain, Metadata: md})
	}
	if g.allowed != nil && !g.allowed.has(c.id) {
		st := status.New(codes.PermissionDenied, "this caller's identity may not call paymentsd; this call sent nothing to the provider: ask the payments team to add the caller's SPIFFE ID (or dns:name) to PAYMENTS_ALLOWED_CALLERS")
		return withDetails(st, &errdetails.ErrorInfo{Reason: ReasonCallerNotAllowed, Domain: ErrorDomain, Metadata: map[string]string{"caller": c.id.String()}})
	}
	return nil
}

func (g gate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
