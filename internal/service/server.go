package service

import (
	"context"
	"crypto/x509"
	_ "embed"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"buf.build/go/protovalidate"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	paymentsgw "example.com/paymentsd/gen/gateway/payments/v1"
	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// openAPI is gen/openapi/payments.swagger.json, copied here by .ci/gen.
//
//go:embed openapi.json
var openAPI []byte

// LivenessService is the grpc.health.v1 service name that answers SERVING
// for as long as the process runs, draining or not. The empty name answers
// for readiness.
const LivenessService = "liveness"

// Options configures NewServer.
type Options struct {
	// Logger gets the access log and panics.
	Logger *slog.Logger
	// Registerer and Gatherer hold the metrics; labels common to every
	// series, such as the environment, belong on Registerer.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// TracerProvider and Propagator configure server spans; nil disables.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	// MaxRequestBytes caps a request: the gRPC message and the REST body.
	MaxRequestBytes int
	// GRPCOptions are added to the gRPC server's, for example credentials.
	GRPCOptions []grpc.ServerOption
	// Events, if set, serves ProviderEventsService (the webhook inbox) on
	// both ports, through the same interceptors.
	Events paymentsv1.ProviderEventsServiceServer
	// MaxInFlight caps calls in progress over both ports together; past it
	// gRPC callers get RESOURCE_EXHAUSTED and REST callers 429. Health
	// checks, reflection and the HTTP port's other endpoints are exempt.
	// Zero means DefaultMaxInFlight.
	MaxInFlight int
	// ReadTimeout bounds reading the body of any request on the HTTP port,
	// from when its header is in; zero means DefaultReadTimeout. (The
	// header's bound is the http.Server's.)
	ReadTimeout time.Duration
	// RequireIdentity refuses every call but health checks and reflection
	// (PERMISSION_DENIED, CALLER_NOT_ALLOWED) from a caller whose client
	// certificate names no Identity: set it whenever client certificates
	// are required.
	RequireIdentity bool
	// AllowedCallers, when not empty, are the only caller identities that
	// may call everything (but health checks and reflection, which are
	// open); AdminCallers and EventReaders not among them may call only
	// what their role needs: an admin all but CreateMultiCardPayment, an
	// event reader ProviderEventsService alone. Empty, every caller
	// identity may call everything.
	AllowedCallers []Identity
	// Version is the build's version, which GET /openapi.json gives as
	// the document's info.version; empty leaves the generated one.
	Version      string
	AdminCallers []Identity
	EventReaders []Identity
	// StillTrusted, when set, is asked at every call (but health checks
	// and reflection), and all along an open stream (see Clock), whether the caller's certificate, whose chains were
	// verified when its connection opened, would still be: not expired,
	// and chaining to a client CA still in use. Its error refuses the
	// call (PERMISSION_DENIED, CALLER_NOT_ALLOWED, and the error in the
	// ErrorInfo metadata "problem"). A connection outlives its
	// certificate, and the client CAs are re-read under it: without
	// this, an expired certificate, or one of a CA since removed, would
	// go on naming its caller there.
	StillTrusted func(verifiedChains [][]*x509.Certificate) error
	// Clock, the clock StillTrusted judges expiry by, is what an open
	// stream waits on to be checked again when its caller's certificate
	// (or a CA of its chain) expires; nil is the host's clock. A stream is
	// also checked again whenever TrustChanged says, and before each
	// message it sends; once StillTrusted (or the allowlists) no longer
	// admits its caller, it ends with that refusal.
	Clock Clock
	// TrustChanged, if set, returns a channel that is closed the next time
	// the client CAs that StillTrusted goes by change: open streams are
	// checked again then.
	TrustChanged func() <-chan struct{}

	// generatedCreate leaves a REST create to the generated gateway
	// handler rather than serveCreate: for the test that compares them.
	generatedCreate bool
}

// Server is the gRPC server and the HTTP handler (REST gateway, health,
// metrics, OpenAPI) for one PaymentsService, sharing one interceptor chain.
type Server struct {
	// GRPC serves PaymentsService, grpc.health.v1 and server reflection.
	GRPC *grpc.Server
	// HTTP serves REST, /healthz, /readyz, /metrics and /openapi.json.
	HTTP http.Handler
	// Health serves health checks and nothing else, for the kubelet's
	// probes, which present no client certificate: grpc.health.v1 Check
	// and List (gRPC over cleartext HTTP/2, as the kubelet's gRPC probe
	// speaks it) and GET /healthz and /readyz. Serve it on a listener of
	// its own, without TLS, from an http.Server that accepts unencrypted
	// HTTP/2.
	Health http.Handler

	health  *health.Server
	mu      sync.Mutex
	serving bool // the listeners are up and not draining
	storeOK bool // the record store answers
	ready   atomic.Bool

	// unary is the gRPC server's unary interceptor chain, which the REST
	// gateway's calls go through too.
	unary grpc.UnaryServerInterceptor

	// stopCtx ends when HardStop is called; in-flight handlers' contexts
	// end with it.
	stopCtx context.Context
	stop    context.CancelFunc
}

// NewServer wires svc into a gRPC server and a REST gateway. Both start out
// not ready; call SetServing once the listeners are up.
func NewServer(svc paymentsv1.PaymentsServiceServer, opts Options) (*Server, error) {
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("protovalidate: %w", err)
	}
	metrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}),
	))
	if err := opts.Registerer.Register(metrics); err != nil {
		return nil, fmt.Errorf("register gRPC metrics: %w", err)
	}

	maxInFlight := opts.MaxInFlight
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	readTimeout := opts.ReadTimeout
	if readTimeout <= 0 {
		readTimeout = DefaultReadTimeout
	}
	env := environmentOf(svc)
	limit := newLimiter(maxInFlight, env)
	allowed := gate{
		env:             env,
		requireIdentity: opts.RequireIdentity,
		allowed:         newIdentitySet(opts.AllowedCallers),
		admins:          newIdentitySet(opts.AdminCallers),
		readers:         newIdentitySet(opts.EventReaders),
		stillTrusted:    opts.StillTrusted,
		clock:           opts.Clock,
		trustChanged:    opts.TrustChanged,
	}
	s := &Server{health: health.NewServer(), storeOK: true}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "paymentsd_ready",
		Help: "1 while this replica is ready (serving and its record store writes), 0 while it is not (starting, draining, or the store failing): what /readyz answers.",
	}, func() float64 {
		if s.ready.Load() {
			return 1
		}
		return 0
	})
	if err := opts.Registerer.Register(ready); err != nil {
		return nil, fmt.Errorf("register readiness metric: %w", err)
	}

	// Outermost first: metrics and the access log see the final code,
	// including Internal from a recovered panic; the caller's identity is
	// known to the access log, which records refusals too; validation runs
	// before the handler, so an invalid request never reaches the provider.
	// The in-flight cap is not here: it admits gRPC streams as their
	// headers arrive (InTapHandle) and REST requests before their bodies.
	unary := &unaryChain{
		metrics:   metrics.UnaryServerInterceptor(),
		logger:    opts.Logger,
		gate:      allowed,
		validator: validator,
		recovered: recoverPanic(opts.Logger, env),
		stop:      s.stopCtx,
		env:       env,
	}
	chain := unary.intercept

	// The same, for streams (WatchProviderEvents, health Watch,
	// reflection).
	streamChain := grpc.ChainStreamInterceptor(
		metrics.StreamServerInterceptor(),
		streamRequestID,
		streamAccessLog(opts.Logger),
		allowed.stream,
		recovery.StreamServerInterceptor(recovery.WithRecoveryHandlerContext(recoverPanic(opts.Logger, env))),
		validateStream(validator),
		s.hardStopStream,
	)

	s.unary = chain
	grpcOpts := []grpc.ServerOption{
		grpc.UnaryInterceptor(chain),
		streamChain,
		grpc.MaxRecvMsgSize(opts.MaxRequestBytes),
		grpc.ForceServerCodecV2(newServerCodec()),
		// Reuse handler goroutines, whose stacks have already grown to what
		// a call needs, instead of starting (and growing) one per call.
		grpc.NumStreamWorkers(uint32(goruntime.GOMAXPROCS(0))),
	}
	grpcOpts = append(grpcOpts, limit.grpcOptions()...)
	if opts.TracerProvider != nil {
		grpcOpts = append(grpcOpts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(opts.TracerProvider),
			otelgrpc.WithPropagators(opts.Propagator),
		)))
	}
	grpcOpts = append(grpcOpts, opts.GRPCOptions...)

	s.GRPC = grpc.NewServer(grpcOpts...)
	paymentsv1.RegisterPaymentsServiceServer(s.GRPC, svc)
	if opts.Events != nil {
		paymentsv1.RegisterProviderEventsServiceServer(s.GRPC, opts.Events)
	}
	healthpb.RegisterHealthServer(s.GRPC, s.health)
	reflection.Register(s.GRPC)
	metrics.InitializeMetrics(s.GRPC)
	s.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	s.SetServing(false)

	rs, err := routesFromOpenAPI(openAPI)
	if err != nil {
		return nil, err
	}
	doc, err := openAPIWithVersion(openAPI, opts.Version)
	if err != nil {
		return nil, err
	}
	gateway := runtime.NewServeMux(
		runtime.WithRoutingErrorHandler(rs.routingError(env)),
		runtime.WithMiddlewares(requireJSON(env)),
		// A form-encoded POST must not turn into a GET, nor a header
		// change the method.
		runtime.WithDisablePathLengthFallback(),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, restJSON),
		runtime.WithIncomingHeaderMatcher(restIncomingHeader),
		runtime.WithErrorHandler(restError(env)),
		runtime.WithForwardResponseOption(markReplayed),
		// X-Request-Id is set on every answer by withRequestID, with the
		// ID the call was given.
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
	)
	// The gateway calls the service in-process, through the same chain as
	// gRPC calls, rather than over a loopback connection.
	payments := newChained(svc, unary, env)
	if err := paymentsgw.RegisterPaymentsServiceHandlerServer(context.Background(), gateway, payments); err != nil {
		return nil, fmt.Errorf("register gateway: %w", err)
	}
	// After the generated handlers: the mux routes a create to the last
	// handler registered for its route.
	if !opts.generatedCreate {
		if err := gateway.HandlePath(http.MethodPost, createPath, payments.serveCreate(gateway)); err != nil {
			return nil, fmt.Errorf("register gateway: %w", err)
		}
	}
	if opts.Events != nil {
		if err := paymentsgw.RegisterProviderEventsServiceHandlerServer(context.Background(), gateway, &chainedEvents{list: unary.bind(listEventsInfo, unaryHandler(opts.Events.ListProviderEvents))}); err != nil {
			return nil, fmt.Errorf("register events gateway: %w", err)
		}
	}
	// Spans cover a REST call from the port's mux on: the limits and the
	// body's limit are inside them, and the body the handlers read is
	// limitBody's (restBody, which decodeCreate reads), over otelhttp's.
	traced := func(h http.Handler) http.Handler {
		if opts.TracerProvider == nil {
			return h
		}
		return otelhttp.NewHandler(h, "rest",
			otelhttp.WithTracerProvider(opts.TracerProvider),
			otelhttp.WithPropagators(opts.Propagator),
		)
	}
	restCall := func(h http.Handler) http.Handler {
		return traced(limit.limitHTTP(limitBody(int64(opts.MaxRequestBytes), readTimeout, env, trackGatewayCall(h))))
	}

	mux := http.NewServeMux()
	gatewayCall := dropEmptyQuery(gateway)
	v1 := restCall(gatewayCall)
	mux.Handle("/v1/", v1)
	if !opts.generatedCreate {
		// A create goes straight to its handler, with the middleware the
		// gateway's mux would have run it with (requireJSON): routing it
		// through the mux only matched the one pattern, and cost a REST
		// create's handler goroutine 1.4 KiB of frames (enough to grow
		// its stack to 16 KiB while it waits for the provider) and ten
		// allocations. Its query is not read (its body is the whole
		// request), so dropEmptyQuery has nothing to do. A path written in
		// other than its plain encoding (RawPath) is the mux's to match,
		// as before.
		create := requireJSON(env)(payments.serveCreate(gateway))
		mux.Handle(http.MethodPost+" "+createPath, restCall(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.RawPath != "" {
				gatewayCall.ServeHTTP(w, r)
				return
			}
			create(w, r, nil)
		})))
	}
	// The list, named on its own: otherwise the pattern below would have
	// ServeMux redirect it to the collection with a trailing slash.
	mux.Handle("GET /v1/multi-card-payments", v1)
	// The lookup route takes keys with slashes ({idempotency_key=**}),
	// which would also match the collection with a trailing slash and an
	// empty key: that is no lookup, and no list either.
	mux.HandleFunc("GET /v1/multi-card-payments/{$}", func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, env, http.StatusNotFound, codes.NotFound, "no idempotency key in the path: look one up with GET /v1/multi-card-payments/{idempotency_key}, or list with GET /v1/multi-card-payments", 0)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(doc)
	})
	s.HTTP = readDeadline(readTimeout, withRequestID(identifyHTTP(mux)))
	s.Health = s.healthHandler()
	return s, nil
}

// healthHandler is Server.Health.
func (s *Server) healthHandler() http.Handler {
	checks := grpc.NewServer(
		grpc.MaxRecvMsgSize(4<<10),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor()),
	)
	healthpb.RegisterHealthServer(checks, healthChecks{h: s.health})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			checks.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// healthChecks is grpc.health.v1 without Watch: a probe asks, and a
// stream held open on the health port would only delay shutdown. Watch
// is on the gRPC port.
type healthChecks struct {
	healthpb.UnimplementedHealthServer
	h *health.Server
}

func (c healthChecks) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return c.h.Check(ctx, req)
}

func (c healthChecks) List(ctx context.Context, req *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return c.h.List(ctx, req)
}

// SetServing flips readiness: grpc.health.v1 for the empty service name and
// PaymentsService, and /readyz. Readiness also needs the record store to
// answer (see WatchStore).
func (s *Server) SetServing(serving bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serving = serving
	s.updateReadiness()
}

func (s *Server) setStoreOK(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storeOK = ok
	s.updateReadiness()
}

func (s *Server) updateReadiness() {
	ready := s.serving && s.storeOK
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.ready.Store(ready)
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(paymentsv1.PaymentsService_ServiceDesc.ServiceName, st)
}

// Readiness flips only after storeFailures consecutive failed pings, and
// back after storeRecoveries consecutive good ones, so one slow query or a
// brief failover doesn't make every replica flap in and out of the load
// balancer.
const (
	storeFailures   = 3
	storeRecoveries = 2
	storePingLimit  = time.Second
)

// WatchStore checks the record store with ping every interval until ctx
// ends, and reports it in readiness: a replica that can't write records
// can't take payments (they would fail closed), so it should get no
// traffic. paymentsd's check is a write (store.CheckWrite), since a store
// can answer and still refuse writes.
func (s *Server) WatchStore(ctx context.Context, ping func(context.Context) error, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	ok, streak := true, 0
	for {
		pctx, cancel := context.WithTimeout(ctx, storePingLimit)
		err := ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if (err == nil) == ok {
			streak = 0
		} else {
			streak++
			if (ok && streak >= storeFailures) || (!ok && streak >= storeRecoveries) {
				ok, streak = !ok, 0
				s.setStoreOK(ok)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// chained is the service as the REST gateway sees it: every call goes
// through the interceptor chain, as a gRPC call would. Each method's chain
// is bound once (unaryChain.bind), not for each call.
type chained struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	env                        paymentsv1.Environment
	create, get, list, resolve grpc.UnaryHandler
}

func newChained(svc paymentsv1.PaymentsServiceServer, chain *unaryChain, env paymentsv1.Environment) *chained {
	return &chained{
		env:     env,
		create:  chain.bind(createInfo, unaryHandler(svc.CreateMultiCardPayment)),
		get:     chain.bind(getInfo, unaryHandler(svc.GetMultiCardPayment)),
		list:    chain.bind(listInfo, unaryHandler(svc.ListMultiCardPayments)),
		resolve: chain.bind(resolveInfo, unaryHandler(svc.ResolveMultiCardPayment)),
	}
}

var (
	createInfo  = &grpc.UnaryServerInfo{FullMethod: paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName}
	getInfo     = &grpc.UnaryServerInfo{FullMethod: paymentsv1.PaymentsService_GetMultiCardPayment_FullMethodName}
	listInfo    = &grpc.UnaryServerInfo{FullMethod: paymentsv1.PaymentsService_ListMultiCardPayments_FullMethodName}
	resolveInfo = &grpc.UnaryServerInfo{FullMethod: paymentsv1.PaymentsService_ResolveMultiCardPayment_FullMethodName}
)

func (c *chained) CreateMultiCardPayment(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	if err := applyHeaderKey(ctx, c.env, req); err != nil {
		// Refused like a body the gateway could not decode, but with
		// REQUEST_NOT_SENT already in its details.
		markReachedService(ctx)
		return nil, err
	}
	resp, err := callChain[*paymentsv1.CreateMultiCardPaymentResponse](ctx, c.create, req)
	if err != nil && req.GetIdempotencyKey() == "" {
		// No key in the body or a header; refused by validation, which
		// counts and logs it as any refusal.
		err = noKeyError(err)
	}
	return resp, err
}

func (c *chained) GetMultiCardPayment(ctx context.Context, req *paymentsv1.GetMultiCardPaymentRequest) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	return callChain[*paymentsv1.GetMultiCardPaymentResponse](ctx, c.get, req)
}

func (c *chained) ListMultiCardPayments(ctx context.Context, req *paymentsv1.ListMultiCardPaymentsRequest) (*paymentsv1.ListMultiCardPaymentsResponse, error) {
	return callChain[*paymentsv1.ListMultiCardPaymentsResponse](ctx, c.list, req)
}

func (c *chained) ResolveMultiCardPayment(ctx context.Context, req *paymentsv1.ResolveMultiCardPaymentRequest) (*paymentsv1.ResolveMultiCardPaymentResponse, error) {
	return callChain[*paymentsv1.ResolveMultiCardPaymentResponse](ctx, c.resolve, req)
}

// unaryHandler is method as a grpc.UnaryHandler, as grpc-go's generated
// code makes one for each call.
func unaryHandler[Req, Resp any](method func(context.Context, Req) (Resp, error)) grpc.UnaryHandler {
	return func(ctx context.Context, req any) (any, error) {
		return method(ctx, req.(Req))
	}
}

// callChain calls bound, a method's chain (unaryChain.bind), as the gRPC
// server would.
func callChain[Resp any](ctx context.Context, bound grpc.UnaryHandler, req any) (Resp, error) {
	markReachedService(ctx)
	resp, err := bound(ctx, req)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp.(Resp), nil
}

// chainedEvents is ProviderEventsService as the REST gateway sees it, like
// chained.
type chainedEvents struct {
	paymentsv1.UnimplementedProviderEventsServiceServer
	list grpc.UnaryHandler
}

var listEventsInfo = &grpc.UnaryServerInfo{FullMethod: paymentsv1.ProviderEventsService_ListProviderEvents_FullMethodName}

func (c *chainedEvents) ListProviderEvents(ctx context.Context, req *paymentsv1.ListProviderEventsRequest) (*paymentsv1.ListProviderEventsResponse, error) {
	return callChain[*paymentsv1.ListProviderEventsResponse](ctx, c.list, req)
}

// restError is the gateway's error handler with two changes: a reused or
// expired idempotency key is 422 Unprocessable Content, as the IETF
// Idempotency-Key draft has it, rather than FAILED_PRECONDITION's usual
// 400 (and so is a resolution of a record that is not in doubt); and the
// gateway's own refusal of a CreateMultiCardPayment call (a body it could
// not decode) carries ErrorInfo REQUEST_NOT_SENT, as paymentsd's other
// refusals do.
func restError(env paymentsv1.Environment) runtime.ErrorHandlerFunc {
	return func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
		if st, ok := status.FromError(err); ok && gatewayRefusal(r) && st.Code() == codes.InvalidArgument {
			// What the gateway could not read (the body, a query
			// parameter), said in the caller's terms.
			p := proto.CloneOf(st.Proto())
			p.Message = decodeErrorMessage(p.Message)
			err = status.FromProto(p).Err()
		}
		if st, ok := status.FromError(err); ok && createsPayment(r) && gatewayRefusal(r) {
			if withInfo, err2 := st.WithDetails(notSentInfo(env)); err2 == nil {
				err = withInfo.Err()
			}
		}
		if st, ok := status.FromError(err); ok {
			setRetryAfter(w, st)
		}
		if hasReason(err, ReasonKeyReused) || hasReason(err, ReasonRecordNotUnknown) || hasReason(err, ReasonRecordChanged) || (hasReason(err, ReasonKeyExpired) && createsPayment(r)) {
			w = statusOverride{ResponseWriter: w, status: http.StatusUnprocessableEntity}
		}
		runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
	}
}

// environmentOf is the environment svc serves, which the transport's own
// refusals name as the Service's errors do; unspecified for a service
// other than *Service (a test's).
func environmentOf(svc paymentsv1.PaymentsServiceServer) paymentsv1.Environment {
	if s, ok := svc.(*Service); ok {
		return s.env
	}
	return paymentsv1.Environment_ENVIRONMENT_UNSPECIFIED
}

// statusOverride writes status instead of the status it is given.
type statusOverride struct {
	http.ResponseWriter
	status int
}

func (w statusOverride) WriteHeader(int) { w.ResponseWriter.WriteHeader(w.status) }

func (w statusOverride) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hasReason reports whether err's status carries an ErrorInfo with reason.
func hasReason(err error, reason string) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reason {
			return true
		}
	}
	return false
}
