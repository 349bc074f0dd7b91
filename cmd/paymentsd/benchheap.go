//go:build benchprofile

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

// Built only with -tags=benchprofile (paymentsbench -pprof builds it so):
// with PAYMENTSBENCH_HEAPDIR set, the process samples its heap finely and,
// each time its goroutines reach a new high above 500 (calls piling up in
// flight, as in paymentsbench's peak-RSS phase), writes into that folder
// heap.pprof, goroutine.txt (stacks, grouped) and memstats.txt: what it
// holds at its peak. The production binary has none of this.
func init() {
	dir := os.Getenv("PAYMENTSBENCH_HEAPDIR")
	if dir == "" {
		return
	}
	runtime.MemProfileRate = 4 << 10
	go func() {
		high := 500
		for range time.Tick(100 * time.Millisecond) {
			n := runtime.NumGoroutine()
			if n <= high+high/50 {
				continue
			}
			high = n
			writeHeap(dir, n)
		}
	}()
}

func writeHeap(dir string, goroutines int) {
	// What is live now, not at the last collection.
	runtime.GC()
	if f, err := os.Create(filepath.Join(dir, "heap.pprof")); err == nil {
		pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
	}
	if f, err := os.Create(filepath.Join(dir, "goroutine.txt")); err == nil {
		pprof.Lookup("goroutine").WriteTo(f, 1)
		f.Close()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	os.WriteFile(filepath.Join(dir, "memstats.txt"), fmt.Appendf(nil,
		"goroutines %d\nHeapInuse %d\nHeapAlloc %d\nHeapIdle %d\nHeapReleased %d\nStackInuse %d\nSys %d\nMSpanInuse %d\nGCSys %d\nOtherSys %d\nNextGC %d\n",
		goroutines, m.HeapInuse, m.HeapAlloc, m.HeapIdle, m.HeapReleased, m.StackInuse, m.Sys, m.MSpanInuse, m.GCSys, m.OtherSys, m.NextGC), 0o644)
}
