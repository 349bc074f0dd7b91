package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// setupTracing returns a tracer provider configured by the standard OTEL_*
// variables, or nil, with no exporter at all, when none of them asks for
// traces.
func setupTracing(ctx context.Context, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	exporter := getenv("OTEL_TRACES_EXPORTER")
	if exporter == "none" || (exporter == "" &&
		getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" &&
		getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "") {
		return nil, noop, nil
	}
	// autoexport and the SDK read the OTEL_* variables themselves
	// (exporter, endpoint, headers, sampler, resource attributes).
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, noop, fmt.Errorf("OTEL_TRACES_EXPORTER: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	return tp, tp.Shutdown, nil
}
