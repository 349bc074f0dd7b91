package main

import (
	"slices"
	"time"

	"google.golang.org/grpc/codes"
)

// faultFigures measures each fault's window over the attempts (gRPC
// calls, by start) that overlap it, and the latency of those that overlap
// no window.
func faultFigures(in checkInput, attempts []call, outcome map[string]string) ([]faultStats, latency) {
	faults := slices.Clone(in.Faults)
	slices.SortStableFunc(faults, func(a, b fault) int { return a.Start.Compare(b.Start) })
	slices.SortStableFunc(attempts, func(a, b call) int { return a.Start.Compare(b.Start) })
	var stats []faultStats
	inWindow := make([]bool, len(attempts))
	for i, f := range faults {
		fs := faultStats{fault: f, FailedBy: make(map[string]int)}
		limit := in.End
		if i+1 < len(faults) && faults[i+1].Start.Before(limit) {
			limit = faults[i+1].Start
		}
		fs.Recovered = limit
		if !f.Undone.IsZero() {
			for _, c := range attempts {
				if c.ok() && !c.Start.Before(f.Undone) && c.End.Before(fs.Recovered) {
					fs.Recovered = c.End
				}
			}
		}
		var lat []time.Duration
		var run int
		var runStart time.Time
		successes := []time.Time{f.Start}
		doubt := make(map[string]bool)
		for j, c := range attempts {
			// A call that overlaps the window counts: one that waited
			// through the fault (for a commit, say) felt it.
			if !c.End.After(f.Start) || !c.Start.Before(fs.Recovered) {
				continue
			}
			inWindow[j] = true
			fs.Calls++
			lat = append(lat, c.End.Sub(c.Start))
			if outcome[c.Key] == verdictUnknown {
				doubt[c.Key] = true
			}
			if c.ok() {
				run = 0
				successes = append(successes, c.End)
				continue
			}
			fs.Failed++
			fs.FailedBy[failure(c.Code, c.Reason)]++
			if run == 0 {
				runStart = c.Start
			}
			run++
			if run > fs.LongestFailedRun {
				fs.LongestFailedRun = run
			}
			if s := c.End.Sub(runStart).Seconds(); s > fs.LongestFailedRunSeconds {
				fs.LongestFailedRunSeconds = s
			}
		}
		successes = append(successes, fs.Recovered)
		slices.SortFunc(successes, time.Time.Compare)
		for k := 1; k < len(successes); k++ {
			fs.Unavailable = max(fs.Unavailable, successes[k].Sub(successes[k-1]).Seconds())
		}
		fs.During = distribution(lat)
		fs.InDoubt = len(doubt)
		for k := range doubt {
			if settled(in.Records[k]) {
				fs.Settled++
			}
		}
		stats = append(stats, fs)
	}
	var outside []time.Duration
	for j, c := range attempts {
		if !inWindow[j] {
			outside = append(outside, c.End.Sub(c.Start))
		}
	}
	return stats, distribution(outside)
}

// failure names a failed call's answer: its code, and reason if any.
func failure(code codes.Code, reason string) string {
	if reason == "" {
		return code.String()
	}
	return code.String() + " " + reason
}

// distribution is the p50 and p99 of ds, nearest rank.
func distribution(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	rank := func(p float64) float64 {
		i := int(float64(len(ds))*p+0.999999) - 1
		return float64(ds[max(0, min(i, len(ds)-1))].Microseconds()) / 1000
	}
	return latency{Calls: len(ds), P50: rank(0.50), P99: rank(0.99)}
}
