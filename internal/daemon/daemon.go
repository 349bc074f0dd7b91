// Package daemon is paymentsd serving: it listens on the API ports and
// the side ports (health, metrics, webhooks), starts the background work,
// and drains when its context ends.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// storeCheckInterval is how often readiness checks the record store.
const storeCheckInterval = 2 * time.Second

// newLogger writes JSON lines to w at level and above, each labelled with
// the environment.
func newLogger(cfg *config.Config, w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})).
		With("environment", cfg.Environment)
}

// Run serves cfg until ctx ends, then drains, logging to stderr and
// tracing as the OTEL_* variables in environ say (their exporter "console"
// writes to stdout).
func Run(ctx context.Context, cfg *config.Config, environ []string, stdout, stderr io.Writer) error {
	quietOpenTelemetry(newLogger(cfg, stderr, slog.LevelWarn))
	tracerProvider, shutdownTracing, err := setupTracing(ctx, config.Lookup(environ), stdout)
	if err != nil {
		return err
	}
	defer shutdownTracing(context.WithoutCancel(ctx))

	return Serve(ctx, cfg, stderr, tracerProvider)
}

// Serve runs the service with cfg until ctx ends, then drains it, logging to
// logw.
func Serve(ctx context.Context, cfg *config.Config, logw io.Writer, tracerProvider trace.TracerProvider) error {
	// Calls and problems are logged at PAYMENTS_LOG_LEVEL; the lifecycle
	// lines (effective config, serving, draining, stopped) always are.
	logger := newLogger(cfg, logw, cfg.LogLevel)
	lifecycle := newLogger(cfg, logw, min(cfg.LogLevel, slog.LevelInfo))

	if cfg.Simulate {
		sim := simulator.NewServer()
		defer sim.Close()
		sim.KeepRequests(false)
		// An idempotent provider that plays every outcome for its test
		// keys (docs/simulator.md).
		sim.Idempotent(true)
		sim.SetScript(sim.TestKeys())
		key := randomKey()
		sim.AllowKey(key)
		cfg.BaseURL, cfg.APIKeys, cfg.APIKeyFrom = sim.URL, []config.Secret{config.Secret(key)}, "simulator"
	}
	lifecycle.Info("starting", "config", cfg)

	registry := cfg.Registry
	if registry == nil {
		registry = prometheus.NewRegistry()
	}
	registerer := prometheus.WrapRegistererWith(prometheus.Labels{"environment": cfg.Environment}, registry)
	registerer.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// W3C trace context only: baggage from internal callers must not
	// travel on to the external provider.
	propagator := propagation.TraceContext{}

	httpClient, err := newHTTPClient(cfg, tracerProvider, propagator)
	if err != nil {
		return err
	}
	defer httpClient.CloseIdleConnections()
	client, err := upstream.New(upstream.Config{
		BaseURL:          cfg.BaseURL,
		APIKeys:          config.Plain(cfg.APIKeys),
		HTTPClient:       httpClient,
		MaxRequests:      cfg.UpstreamMaxAttempts,
		Timeout:          cfg.UpstreamTimeout,
		MaxResponseBytes: cfg.UpstreamMaxResponseBytes,
		BreakerFailures:  cfg.BreakerFailures,
		BreakerCooldown:  cfg.BreakerCooldown,
		UserAgent:        "paymentsd/" + cfg.Release,
		Metrics:          upstream.NewMetrics(registerer),
		Logger:           logger,
	})
	if err != nil {
		return err
	}
	secretMetrics := config.NewSecretMetrics(registerer)
	// Simulated payments never share a database with real ones: replayed
	// later, they would read as real sandbox payments.
	stamp := cfg.Environment
	if cfg.Simulate {
		stamp = "simulated"
	}
	records, err := openStore(ctx, cfg, stamp, lifecycle)
	if err != nil {
		return err
	}
	defer closeStore(records, lifecycle)
	// Says, before serving, what a failover of the store could lose.
	replication := service.NewReplicationWatch(records, registerer, lifecycle)
	replication.Check(ctx)
	svc := service.New(service.Config{
		Client:      client,
		Store:       records,
		Environment: cfg.Env(),
		Logger:      logger,
		Registerer:  registerer,
		// A call holds its key for as long as the provider call can take,
		// plus a margin for recording the outcome.
		LeaseTTL:           cfg.UpstreamTimeout + 5*time.Second,
		SettlementWindow:   cfg.SettlementWindow,
		QuietPeriod:        cfg.ProviderQuietPeriod,
		Retention:          cfg.RecordRetention,
		TombstoneRetention: cfg.TombstoneRetention,
		RetentionInterval:  cfg.Hooks.RetentionInterval,
		Now:                cfg.Hooks.Now(),
		MaxSends:           cfg.MaxInFlight,
		AdminCallers:       cfg.AdminCallers,
		// A newcomer trying paymentsd out may list and resolve; simulated
		// payments move no money.
		EveryoneAdmin: cfg.Simulate,
	})
	// The webhook inbox's reader; its events are deleted with the records
	// after PAYMENTS_RECORD_RETENTION.
	events, err := service.NewEvents(records, cfg.Env(), service.EventsOptions{
		Registerer: registerer,
		Logger:     logger,
		Readers:    slices.Concat(cfg.EventReaders, cfg.AdminCallers),
		// Simulated events, like simulated payments, are anyone's.
		EveryoneReads: cfg.Simulate,
	})
	if err != nil {
		return err
	}

	var clock service.Clock = service.SystemClock{}
	if cfg.Hooks.Clock != nil {
		clock = cfg.Hooks.Clock
	}
	now := clock.Now
	serverTLS, err := config.LoadServerTLS(cfg, now, registerer)
	if err != nil {
		return err
	}
	warnUnidentified(cfg, lifecycle)
	// The gRPC and HTTP ports require client certificates when a client CA
	// is set; the webhook port never does.
	var grpcTLS, httpTLS, hooksTLS *tls.Config
	if serverTLS != nil {
		grpcTLS = serverTLS.Config([]string{"h2"}, true)
		httpTLS = serverTLS.Config([]string{"h2", "http/1.1"}, true)
		hooksTLS = serverTLS.Config([]string{"h2", "http/1.1"}, false)
	}
	opts := service.Options{
		Logger:          logger,
		Registerer:      registerer,
		Gatherer:        registry,
		TracerProvider:  tracerProvider,
		Propagator:      propagator,
		MaxRequestBytes: cfg.MaxRequestBytes,
		Events:          events,
		MaxInFlight:     cfg.MaxInFlight,
		ReadTimeout:     cfg.HTTPReadTimeout,
		RequireIdentity: serverTLS.RequiresClientCerts(),
		AllowedCallers:  cfg.AllowedCallers,
		AdminCallers:    cfg.AdminCallers,
		EventReaders:    cfg.EventReaders,
		Version:         cfg.Release,
	}
	// Refused TLS handshakes, on every TLS port, are counted and logged.
	refusals := newHandshakeRefusals(registerer, logger, now)
	if grpcTLS != nil {
		opts.GRPCOptions = append(opts.GRPCOptions, grpc.Creds(refusals.grpcCreds("grpc", credentials.NewTLS(grpcTLS))))
	}
	if serverTLS.RequiresClientCerts() {
		opts.StillTrusted = serverTLS.StillTrusted
		opts.Clock, opts.TrustChanged = clock, serverTLS.ClientCAsChanged
	}
	srv, err := service.NewServer(svc, opts)
	if err != nil {
		return err
	}

	grpcLn, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("PAYMENTS_GRPC_ADDR: %w", err)
	}
	httpLn, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		grpcLn.Close()
		return fmt.Errorf("PAYMENTS_HTTP_ADDR: %w", err)
	}
	// Past the cap a connection is closed on accept: idle and slow ones
	// cost memory whatever they send.
	grpcLn = service.LimitListener(grpcLn, cfg.MaxConnections)
	httpLn = service.LimitListener(httpLn, cfg.MaxConnections)
	hooks, err := listenWebhooks(cfg, records, events, logger, registerer, hooksTLS, tracerProvider)
	if err != nil {
		grpcLn.Close()
		httpLn.Close()
		return err
	}
	evicted := newEvictedConnections(registerer)
	scrape, err := listenMetrics(cfg, registry, logger, evicted.WithLabelValues("metrics"))
	if err != nil {
		grpcLn.Close()
		httpLn.Close()
		hooks.close()
		return err
	}
	probes, err := listenHealth(cfg, srv.Health, logger, evicted.WithLabelValues("health"))
	if err != nil {
		grpcLn.Close()
		httpLn.Close()
		hooks.close()
		scrape.close()
		return err
	}
	// REST connections close after service.MaxConnectionAge, as gRPC ones
	// do.
	age := service.ConnAge{Now: now}
	httpSrv := &http.Server{
		Handler:           age.Handler(srv.HTTP),
		ConnContext:       age.ConnContext,
		TLSConfig:         httpTLS,
		MaxHeaderBytes:    service.MaxHeaderBytes,
		ReadHeaderTimeout: cfg.HTTPReadTimeout,
		// The body's read deadline is set per request, once its header is
		// in (see service.Options.ReadTimeout); ReadTimeout here would
		// cancel a request's context mid-payment once it passed.
		IdleTimeout: service.IdleTimeout,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          service.MaxConcurrentStreams,
			MaxReceiveBufferPerConnection: 1 << 20,
			MaxReceiveBufferPerStream:     int(cfg.MaxRequestBytes),
		},
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	if httpTLS != nil {
		refusals.httpServer("http", httpSrv, logger)
	}
	if hooks.tls {
		refusals.httpServer("webhooks", hooks.srv, logger)
	}

	errc := make(chan error, 5)
	go func() { errc <- srv.GRPC.Serve(grpcLn) }()
	go func() {
		if httpTLS != nil {
			errc <- httpSrv.ServeTLS(httpLn, "", "")
			return
		}
		errc <- httpSrv.Serve(httpLn)
	}()
	hooks.serve(errc)
	scrape.serve(errc)
	probes.serve(errc)
	srv.SetServing(true)
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { svc.Run(bgCtx) })
	// Readiness writes, not pings: a store that answers but can't write
	// (a full volume, a read-only failover) takes no payment.
	background.Go(func() { srv.WatchStore(bgCtx, records.CheckWrite, storeCheckInterval) })
	background.Go(func() { hooks.watchUsage(bgCtx) })
	background.Go(func() { replication.Watch(bgCtx, service.DefaultReplicationInterval) })
	background.Go(func() {
		cfg.WatchAPIKeys(bgCtx, secretMetrics, lifecycle, func(keys []string) ([]slog.Attr, error) {
			if err := client.SetKeys(keys); err != nil {
				return nil, err
			}
			loaded, inUse := client.Keys()
			return []slog.Attr{slog.String("api_key_in_use", inUse), slog.Any("api_keys", loaded)}, nil
		})
	})
	if serverTLS != nil {
		background.Go(func() { serverTLS.Watch(bgCtx, cfg.SecretReloadInterval, secretMetrics, lifecycle) })
	}
	if hooks.handler != nil {
		background.Go(func() { cfg.WatchWebhookTokens(bgCtx, secretMetrics, lifecycle, hooks.handler.SetTokens) })
	}
	lifecycle.Info("serving", "grpc_addr", grpcLn.Addr().String(), "http_addr", httpLn.Addr().String(), "webhook_addr", hooks.addr(), "metrics_addr", scrape.addr(), "health_addr", probes.addr(),
		"replica", svc.Replica())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}

	// Drain: readiness goes first, so probes and load balancers stop
	// sending; after the shutdown delay (time for endpoints to update) the
	// listeners close, and in-flight calls finish within the timeout.
	lifecycle.Info("draining", "delay", cfg.ShutdownDelay.String(), "timeout", cfg.ShutdownTimeout.String())
	srv.SetServing(false)
	if cfg.ShutdownDelay > 0 && serveErr == nil {
		time.Sleep(cfg.ShutdownDelay)
	}
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	// Open watches never end by themselves: end them, or GracefulStop
	// would wait for them until the timeout.
	events.Close()
	hooksDone := make(chan error, 1)
	go func() { hooksDone <- hooks.shutdown(drainCtx) }()
	// At the drain deadline, calls still in flight are cut off: their
	// handlers' contexts end, and each answers with paymentsd's own status
	// (ErrorInfo says whether a payment may exist). They get hardStopGrace
	// to send it before the connections are closed.
	stopHard := context.AfterFunc(drainCtx, func() {
		if errors.Is(drainCtx.Err(), context.DeadlineExceeded) {
			logger.Warn("shutdown timeout expired: cutting off calls in flight")
			srv.HardStop()
		}
	})
	defer stopHard()
	finalCtx, cancelFinal := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout+hardStopGrace)
	defer cancelFinal()
	stopped := make(chan struct{})
	go func() {
		srv.GRPC.GracefulStop()
		close(stopped)
	}()
	httpErr := httpSrv.Shutdown(finalCtx)
	scrape.shutdown(finalCtx)
	probes.shutdown(finalCtx)
	select {
	case <-stopped:
	case <-finalCtx.Done():
		srv.GRPC.Stop()
		<-stopped
	}
	if httpErr != nil {
		httpSrv.Close()
		logger.Warn("shutdown timeout expired with REST calls in flight", "error", httpErr.Error())
	}
	if err := <-hooksDone; err != nil {
		logger.Warn("shutdown timeout expired with webhook deliveries in flight", "error", err.Error())
	}
	// Provider requests whose callers gave up are still waited on, and
	// their outcomes recorded, until the drain deadline; then they are
	// cut off (and recorded as possibly still at the provider).
	svc.Shutdown(drainCtx)
	stopBackground()
	background.Wait()
	lifecycle.Info("stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}

// storeCloseTimeout bounds closing the record store at exit.
const storeCloseTimeout = 5 * time.Second

// closeStore closes the record store, waiting at most storeCloseTimeout: a
// database whose server hangs (frozen, or cut off without a reset) never
// answers the transaction in progress, and closing would wait for it
// until Kubernetes SIGKILLs the pod. By then the drain has logged every
// outcome it could not record; exiting closes the connections.
func closeStore(records *store.Store, logger *slog.Logger) {
	closed := make(chan struct{})
	go func() {
		records.Close()
		close(closed)
	}()
	t := time.NewTimer(storeCloseTimeout)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		logger.Warn("the record store did not close: its database has not answered a transaction in progress; exiting without waiting for it",
			"waited", storeCloseTimeout.String())
	}
}

// openStore opens the record store, bounded by
// PAYMENTS_DATABASE_CONNECT_TIMEOUT and PAYMENTS_DATABASE_MIGRATE_TIMEOUT,
// saying first what it waits for and which variables bound the wait, so a
// database that never answers is told from a slow one. Its refusal names
// the variable to look at.
func openStore(ctx context.Context, cfg *config.Config, stamp string, logger *slog.Logger) (*store.Store, error) {
	logger.Info("opening the record store",
		"waiting_for", "a connection to the database, then its migrations; the ports open after",
		"database", cfg.DatabaseShown, "database_from", cfg.DatabaseFrom,
		"connect_timeout", cfg.ConnectTimeout.String(), "connect_timeout_from", "PAYMENTS_DATABASE_CONNECT_TIMEOUT",
		"migrate_timeout", cfg.MigrateTimeout.String(), "migrate_timeout_from", "PAYMENTS_DATABASE_MIGRATE_TIMEOUT")
	records, err := store.Open(ctx, string(cfg.DatabaseURL), stamp, store.Options{
		Retention:      cfg.RecordRetention,
		ConnectTimeout: cfg.ConnectTimeout,
		MigrateTimeout: cfg.MigrateTimeout,
		Logger:         logger,
		Now:            cfg.Hooks.StoreClock(string(cfg.DatabaseURL)),
		InboxQuota:     cfg.WebhookMaxStoredBytes,
	})
	switch {
	case errors.Is(err, store.ErrConnectTimeout):
		return nil, fmt.Errorf("%s: the database at %s did not answer within PAYMENTS_DATABASE_CONNECT_TIMEOUT (%v): check that it is up and reachable from here (host, port, firewall, NetworkPolicy egress), or raise the timeout: %w",
			cfg.DatabaseVar(), cfg.DatabaseShown, cfg.ConnectTimeout, err)
	case errors.Is(err, store.ErrMigrateTimeout):
		return nil, fmt.Errorf("%s: the database at %s answered, but its migrations did not finish within PAYMENTS_DATABASE_MIGRATE_TIMEOUT (%v); another replica may hold the migration lock: %w",
			cfg.DatabaseVar(), cfg.DatabaseShown, cfg.MigrateTimeout, err)
	case err != nil && cfg.DatabaseFrom != cfg.DatabaseVar():
		// The default, or a file: say which database it was.
		return nil, fmt.Errorf("%s (%s, from %s): %w", cfg.DatabaseVar(), cfg.DatabaseShown, cfg.DatabaseFrom, err)
	case err != nil:
		return nil, fmt.Errorf("%s (%s): %w", cfg.DatabaseVar(), cfg.DatabaseShown, err)
	}
	return records, nil
}

// hardStopGrace is how long calls cut off at the drain deadline have to
// send their status before connections are closed. deploy/'s
// terminationGracePeriodSeconds leaves room for it.
const hardStopGrace = 2 * time.Second

// newHTTPClient is the client for the provider: a pooled transport sized
// for many concurrent calls to one host, no redirects (a redirected POST
// would become a GET), and a timeout as a backstop to the per-call context.
func newHTTPClient(cfg *config.Config, tp trace.TracerProvider, prop propagation.TextMapPropagator) (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.UpstreamCAFile != "" {
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		pem, err := os.ReadFile(cfg.UpstreamCAFile)
		if err != nil {
			return nil, fmt.Errorf("PAYMENTS_UPSTREAM_CA_FILE: %w", config.FileError(err))
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, errors.New("PAYMENTS_UPSTREAM_CA_FILE: the file it names holds no PEM certificates")
		}
		tlsConfig.RootCAs = roots
	}
	transport := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 5 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		// Requests and replies are small; the 4 KiB defaults cost 2000
		// in-flight calls an extra 10 MiB.
		WriteBufferSize: 1 << 10,
		ReadBufferSize:  2 << 10,
		// Replies are small JSON; gzip would cost CPU and add a header the
		// provider doesn't document.
		DisableCompression: true,
	}
	var rt http.RoundTripper = transport
	if tp != nil {
		rt = otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(prop))
	}
	return &http.Client{
		Transport: rt,
		Timeout:   cfg.UpstreamTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

// warnUnidentified says, at start, that callers will not be identified
// when no client CA is set: loudly, naming the variable, since caller
// isolation, the admin calls and the events then work for nobody.
// --simulate moves no money, and says nothing.
func warnUnidentified(cfg *config.Config, logger *slog.Logger) {
	if cfg.TLSClientCAFile != "" || cfg.Simulate {
		return
	}
	level := slog.LevelWarn
	if cfg.Environment == "live" {
		level = slog.LevelError // started only because PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS is true
	}
	logger.Log(context.Background(), level, "callers are not identified: PAYMENTS_TLS_CLIENT_CA_FILE is not set",
		"variable", "PAYMENTS_TLS_CLIENT_CA_FILE",
		"consequences", "every caller that reaches the ports may pay and look up any key; records name no caller; nobody may list or resolve payments or read provider events",
		"fix", "serve mTLS with client certificates from the callers' CA (see docs/identity.md)",
		"allow_unidentified_callers", cfg.AllowUnidentifiedCallers)
}

func randomKey() string {
	var b [24]byte
	rand.Read(b[:])
	return "sim_" + hex.EncodeToString(b[:])
}
