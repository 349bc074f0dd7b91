package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: 1/CLK_TCK
// seconds, 10ms almost everywhere.
func clockTick(ctx context.Context) time.Duration {
	out, err := exec.CommandContext(ctx, "getconf", "CLK_TCK").Output()
	if err != nil {
		return 10 * time.Millisecond
	}
	hz, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || hz <= 0 {
		return 10 * time.Millisecond
	}
	return time.Second / time.Duration(hz)
}

// cpuTime is the CPU time, user plus system, that process pid has used in
// all its threads, from the process's own accounting in /proc/<pid>/stat.
// The kernel keeps it in nanoseconds but reports whole clock ticks, so a
// difference of two readings is within two ticks of the truth.
func cpuTime(pid int, tick time.Duration) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces or
	// parentheses itself: count fields from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime %q or stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * tick, nil
}

// memory is a process's resident set now (VmRSS) and at its peak (VmHWM),
// in KiB, from /proc/<pid>/status.
func memory(pid int) (rssKiB, peakKiB int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &rssKiB
		case "VmHWM":
			dst = &peakKiB
		default:
			continue
		}
		// "VmHWM:	   12345 kB"
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, name, err)
		}
		*dst = n
	}
	if rssKiB == 0 || peakKiB == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS or VmHWM", pid)
	}
	return rssKiB, peakKiB, nil
}
