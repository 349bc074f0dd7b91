package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// setupTracing returns a tracer provider configured by the standard OTEL_*
// variables, or nil, with no exporter at all, when none of them asks for
// traces. OTEL_TRACES_EXPORTER is otlp (the default once an OTLP endpoint
// is set), console (spans on stdout) or none; the OTLP exporters and the SDK
// read the rest themselves (endpoint, headers, protocol-specific settings,
// sampler, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
//
// Only the trace exporters are linked in, rather than autoexport with its
// metric and log exporters: that keeps the binary, and so paymentsd's
// resident set, smaller.
func setupTracing(ctx context.Context, getenv func(string) string, stdout io.Writer) (trace.TracerProvider, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	var exporter sdktrace.SpanExporter
	var err error
	switch kind := getenv("OTEL_TRACES_EXPORTER"); kind {
	case "none":
		return nil, noop, nil
	case "console":
		exporter, err = stdouttrace.New(stdouttrace.WithWriter(stdout))
	case "", "otlp":
		if kind == "" && getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, noop, nil
		}
		if err := checkOTLPHeaders(getenv); err != nil {
			return nil, noop, err
		}
		protocolVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
		protocol := getenv(protocolVar)
		if protocol == "" {
			protocolVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
			protocol = getenv(protocolVar)
		}
		switch protocol {
		case "", "http/protobuf":
			exporter, err = otlptracehttp.New(ctx)
		case "grpc":
			exporter, err = otlptracegrpc.New(ctx)
		default:
			// Never the value: a key pasted into the wrong variable
			// must not be printed.
			return nil, noop, fmt.Errorf("%s: want grpc or http/protobuf", protocolVar)
		}
	default:
		return nil, noop, errors.New("OTEL_TRACES_EXPORTER: want otlp, console or none")
	}
	if err != nil {
		// Not the error's text: it may quote an endpoint with credentials.
		return nil, noop, errors.New("OTEL_EXPORTER_OTLP_*: the trace exporter could not be made from these settings")
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
	return tp, tp.Shutdown, nil
}

// checkOTLPHeaders refuses OTLP headers the exporter could not parse. The
// exporter would skip such an entry and print it, which may hold a
// collector's credentials, to stderr through OpenTelemetry's own logger;
// refused here, only the variable is named.
func checkOTLPHeaders(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		v := getenv(name)
		if v == "" {
			continue
		}
		for _, pair := range strings.Split(v, ",") {
			key, value, ok := strings.Cut(pair, "=")
			key = strings.TrimSpace(key)
			_, err := url.PathUnescape(value)
			if !ok || key == "" || strings.ContainsFunc(key, func(r rune) bool { return !isTokenChar(r) }) || err != nil {
				return fmt.Errorf("%s: want comma-separated name=value pairs, values percent-encoded", name)
			}
		}
	}
	return nil
}

// isTokenChar reports whether r may appear in an HTTP header name.
func isTokenChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// quietOpenTelemetry sends OpenTelemetry's own diagnostics (a malformed
// OTEL_* value, a failed export) to logger as their messages alone, at
// error level. Their attributes and error texts quote the values they
// failed on (an endpoint URL with credentials, a header), which must not
// reach any output.
func quietOpenTelemetry(logger *slog.Logger) {
	otel.SetLogger(logr.FromSlogHandler(messagesOnly{logger.Handler()}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {
		logger.Error("OpenTelemetry failed to export spans, or could not use an OTEL_* setting; its details are withheld, as they may quote credentials")
	}))
}

// messagesOnly is a slog.Handler that keeps each record's message and drops
// its attributes.
type messagesOnly struct{ slog.Handler }

func (h messagesOnly) Handle(ctx context.Context, r slog.Record) error {
	return h.Handler.Handle(ctx, slog.NewRecord(r.Time, r.Level, "OpenTelemetry: "+r.Message, r.PC))
}

func (h messagesOnly) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h messagesOnly) WithGroup(string) slog.Handler      { return h }
