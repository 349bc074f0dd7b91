package main

import (
	"net"
	"strings"
	"testing"

	"example.com/paymentsd/internal/cli"
)

// TestCLIConnectionErrors: a CLI that can't reach paymentsd says what is
// wrong and what to change, naming the address or host, rather than
// grpc-go's own words ("tls: first record does not look like a TLS
// handshake", "too many colons in address", "produced zero addresses").
func TestCLIConnectionErrors(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := ln.Addr().String()
	ln.Close()

	tests := []struct {
		name string
		conn []string
		code int
		// says are what the error must name: the address or host, and
		// the flag to change.
		says []string
	}{
		{"TLS to a plaintext paymentsd", []string{"--addr", in.grpcAddr}, cli.ExitFailure, []string{in.grpcAddr, "--insecure"}},
		{"a URL", []string{"--addr", "http://" + in.grpcAddr, "--insecure"}, cli.ExitUsage, []string{"http://" + in.grpcAddr, "host:port"}},
		{"an unknown host", []string{"--addr", "paymentsd.invalid:9090", "--insecure"}, cli.ExitFailure, []string{"paymentsd.invalid", "--addr"}},
		{"no port", []string{"--addr", "localhost", "--insecure"}, cli.ExitUsage, []string{"localhost", "host:port"}},
		{"the REST port", []string{"--addr", in.httpAddr, "--insecure"}, cli.ExitFailure, []string{in.httpAddr, "gRPC port"}},
		{"nothing listening", []string{"--addr", nothing, "--insecure"}, cli.ExitFailure, []string{nothing, "--addr"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, "", "list", append(tt.conn, "--timeout", "20s"))
			if r.code != tt.code {
				t.Errorf("list %q: exit %d, want %d\n%v", tt.conn, r.code, tt.code, r)
			}
			for _, s := range tt.says {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("list %q: the error does not name %q\n%v", tt.conn, s, r)
				}
			}
		})
	}
}
