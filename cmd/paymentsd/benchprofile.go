//go:build benchprofile

package main

import (
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// Built only with -tags=benchprofile, as paymentsbench -pprof builds it:
// with PAYMENTS_BENCH_CPUPROFILE set, SIGUSR1 starts a CPU profile and
// SIGUSR2 writes it to that file. The production binary has no profiling
// endpoint and no such signals.
func init() {
	path := os.Getenv("PAYMENTS_BENCH_CPUPROFILE")
	if path == "" {
		return
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		var f *os.File
		for s := range sig {
			switch {
			case s == syscall.SIGUSR1 && f == nil:
				var err error
				if f, err = os.Create(path); err != nil {
					f = nil
					continue
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					f.Close()
					f = nil
				}
			case s == syscall.SIGUSR2 && f != nil:
				pprof.StopCPUProfile()
				f.Close()
				f = nil
				// Tell the benchmark the file is complete.
				os.WriteFile(path+".done", nil, 0o644)
			}
		}
	}()
}
