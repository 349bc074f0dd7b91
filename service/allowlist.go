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

// ReasonCallerNotAllowed is the ErrorInfo reason of PERMISSION_DENIED for a
// caller whose certificate names no identity in the allowlist.
const ReasonCallerNotAllowed = "CALLER_NOT_ALLOWED"

// CallerAttribute is the server span attribute that carries the caller's
// identity.
const CallerAttribute = "paymentsd.caller"

// identity is what the caller's verified client certificate says it is.
type identity struct {
	// names are the certificate's URI SANs (such as SPIFFE IDs), then its
	// DNS SANs; any one may match the allowlist.
	names []string
}

// caller is the name logged and stored for the caller: its first URI SAN,
// or failing that its first DNS SAN.
func (id *identity) caller() string {
	if id == nil || len(id.names) == 0 {
		return ""
	}
	return id.names[0]
}

type identityKey struct{}

func identityFromCert(cert *x509.Certificate) *identity {
	id := &identity{}
	for _, u := range cert.URIs {
		id.names = append(id.names, u.String())
	}
	id.names = append(id.names, cert.DNSNames...)
	return id
}

// CallerFromContext returns the identity of the caller of the call whose
// context ctx is: the first URI SAN (for example a SPIFFE ID) of its mTLS
// client certificate, or failing that its first DNS SAN; "" when the
// connection carried no client certificate.
func CallerFromContext(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(*identity)
	return id.caller()
}

// identifyHTTP puts the REST caller's certificate identity in the request's
// context: the gateway calls the service in-process with that context, so
// the interceptors see it as they see a gRPC peer's.
func identifyHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			r = r.WithContext(context.WithValue(r.Context(), identityKey{}, identityFromCert(r.TLS.PeerCertificates[0])))
		}
		next.ServeHTTP(w, r)
	})
}

// identityOf returns the caller's identity: set by identifyHTTP for REST,
// or from the gRPC peer's verified certificate.
func identityOf(ctx context.Context) *identity {
	if id, ok := ctx.Value(identityKey{}).(*identity); ok {
		return id
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return nil
	}
	return identityFromCert(tlsInfo.State.PeerCertificates[0])
}

// identify puts the caller's identity in the context, for the access log,
// CallerFromContext and the server span.
func identify(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	id := identityOf(ctx)
	if id == nil {
		return handler(ctx, req)
	}
	if c := id.caller(); c != "" {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(CallerAttribute, c))
	}
	return handler(context.WithValue(ctx, identityKey{}, id), req)
}

// allowlist admits callers any of whose certificate names is in allowed;
// nil admits everyone. Health checks and reflection are always open.
type allowlist map[string]bool

func newAllowlist(callers []string) allowlist {
	if len(callers) == 0 {
		return nil
	}
	a := allowlist{}
	for _, c := range callers {
		a[c] = true
	}
	return a
}

func (a allowlist) permits(id *identity) bool {
	if id == nil {
		return false
	}
	for _, n := range id.names {
		if a[n] {
			return true
		}
	}
	return false
}

func (a allowlist) check(ctx context.Context, fullMethod string) error {
	if a == nil || openMethod(fullMethod) {
		return nil
	}
	id := identityOf(ctx)
	if a.permits(id) {
		return nil
	}
	st := status.New(codes.PermissionDenied, "this caller's client certificate names no identity that may call paymentsd; this call sent nothing to the provider: ask the payments team to add the caller's SPIFFE ID or DNS name to PAYMENTS_ALLOWED_CALLERS")
	info := &errdetails.ErrorInfo{Reason: ReasonCallerNotAllowed, Domain: ErrorDomain}
	if c := id.caller(); c != "" {
		info.Metadata = map[string]string{"caller": c}
	}
	if withDetails, err := st.WithDetails(info); err == nil {
		st = withDetails
	}
	return st.Err()
}

func (a allowlist) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a allowlist) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
