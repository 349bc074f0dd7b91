package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// otelSecret stands for credentials an operator put in an OTEL_* value.
const otelSecret = "otel_SENTINEL_5d1e7b"

// TestOpenTelemetryNeverPrintsValues runs paymentsd, in a child process
// (OpenTelemetry reads the real environment), with OTEL_* values it can't
// use, each holding a secret: OpenTelemetry's own diagnostics must not
// print them, and neither may paymentsd.
func TestOpenTelemetryNeverPrintsValues(t *testing.T) {
	if os.Getenv("PAYMENTSD_TEST_OTEL_CHILD") == "1" {
		otelChild(t)
		return
	}
	t.Parallel()
	for name, env := range map[string][]string{
		"endpoint": {"OTEL_EXPORTER_OTLP_ENDPOINT=https://otel:tok%en-" + otelSecret + "@127.0.0.1:1"},
		"timeout and sampler": {
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1",
			"OTEL_EXPORTER_OTLP_TIMEOUT=" + otelSecret,
			"OTEL_TRACES_SAMPLER=traceidratio",
			"OTEL_TRACES_SAMPLER_ARG=" + otelSecret,
			"OTEL_RESOURCE_ATTRIBUTES=" + otelSecret,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestOpenTelemetryNeverPrintsValues$", "-test.v")
			cmd.Env = append(append(os.Environ(), "PAYMENTSD_TEST_OTEL_CHILD=1", "PAYMENTSD_TEST_OTEL_DIR="+t.TempDir()), env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			if bytes.Contains(out, []byte(otelSecret)) {
				t.Errorf("output holds an OTEL_* value:\n%s", out)
			}
			if !bytes.Contains(out, []byte("child ran")) {
				t.Errorf("the child did not run paymentsd:\n%s", out)
			}
		})
	}
}

// otelChild runs paymentsd briefly, as main does, printing what main would.
func otelChild(t *testing.T) {
	p := fakeProvider(t, "sandbox")
	env := with(sandboxEnv(p),
		"PAYMENTS_GRPC_ADDR", "127.0.0.1:0",
		"PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
		"PAYMENTS_DATABASE_URL", "sqlite:"+filepath.Join(os.Getenv("PAYMENTSD_TEST_OTEL_DIR"), "records.db"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := run(ctx, []string{"paymentsd"}, append(os.Environ(), envList(env)...), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "paymentsd: %v\n", err)
	}
	fmt.Println("child ran")
}
