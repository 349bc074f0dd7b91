package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"example.com/paymentsd/internal/testenv"
)

// BenchmarkFlood replays each of TestFlood's floods against a paymentsd of
// its own and reports how far its peak resident set (VmHWM, paymentsd's
// process alone: stacks, heap and buffers, none of the flooding client's)
// rose over its idle RSS: peak-rise-MiB. The unbounded server rose by 140
// to 470 MiB; docs/security.md gives the figures since, and deploy/'s pod
// has 256 MiB in all.
//
//	go test -run '^$' -bench Flood -benchtime 3x ./cmd/paymentsd/
func BenchmarkFlood(b *testing.B) {
	for _, tt := range floods {
		b.Run(tt.name, func(b *testing.B) {
			provider := fakeProvider(b, "sandbox")
			p := startProcess(b, with(sandboxEnv(provider), flatten(tt.env)...))
			p.pays(b, "warm-up")
			idle, _ := p.memory(b)
			for b.Loop() {
				tt.flood(b, p)
			}
			p.pays(b, "after")
			_, peak := p.memory(b)
			b.ReportMetric(mib(idle), "idle-MiB")
			b.ReportMetric(mib(peak-idle), "peak-rise-MiB")
		})
	}
}

// memory returns paymentsd's VmRSS and VmHWM in bytes.
func (p *process) memory(t testing.TB) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		testenv.Missing(t, "no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = n << 10
		case "VmHWM:":
			hwm = n << 10
		}
	}
	return rss, hwm
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
