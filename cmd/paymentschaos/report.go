package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"example.com/paymentsd/internal/simulator"
)

// report is a run's figures and verdict, as -json writes it.
type report struct {
	Date      time.Time `json:"date"`
	Command   []string  `json:"command"`
	GoVersion string    `json:"go_version"`
	Seed      uint64    `json:"seed"`
	Setup     setup     `json:"setup"`
	// Seconds is how long callers ran; SettleSeconds how long the wait
	// for settlement took after.
	Seconds       float64 `json:"seconds"`
	SettleSeconds float64 `json:"settle_seconds"`
	// DueAtEnd counts the keys settlement still owed an outcome when the
	// callers stopped.
	DueAtEnd   int          `json:"due_at_end"`
	Keys       keyCounts    `json:"keys"`
	Calls      callCounts   `json:"calls"`
	Provider   providerSums `json:"provider"`
	Faults     []faultEntry `json:"faults"`
	Outside    latency      `json:"outside_faults"`
	Violations []violation  `json:"violations"`
	// ViolationCounts counts violations by kind, every kind listed.
	ViolationCounts map[string]int `json:"violation_counts"`
	// Invariants counts the keys that broke each of issue 30's
	// invariants, I1 to I4 (a key breaking one two ways counts once).
	Invariants map[string]int `json:"invariants"`
	// Resends are the keys sent again after a 2xx the provider wrote, each
	// with its reason as kind, and ResendCounts counts them by reason.
	Resends      []violation    `json:"resends"`
	ResendCounts map[string]int `json:"resend_counts"`
	// WithoutOK is the longest time in the run no call was answered OK.
	WithoutOK gap `json:"longest_without_ok"`
	// Resolutions sums the careless person's resolutions, with -careless.
	Resolutions *resolutionCounts `json:"resolutions,omitempty"`
	// Problems are failures of the run itself: a replica that died on its
	// own, a fault not undone, minimums not reached.
	Problems []string `json:"problems"`
	// PaymentsdLog counts the replicas' warnings and errors by message.
	PaymentsdLog map[string]int `json:"paymentsd_log"`
}

type setup struct {
	Store           string     `json:"store"`
	Front           string     `json:"front,omitempty"`
	Replication     string     `json:"replication,omitempty"`
	Provider        string     `json:"provider"`
	Careless        bool       `json:"careless"`
	Replicas        int        `json:"replicas"`
	Callers         int        `json:"raw_callers"`
	ClientCallers   int        `json:"client_callers"`
	LatencyMS       [2]int64   `json:"provider_latency_ms"`
	UpstreamTimeout string     `json:"upstream_timeout"`
	QuietPeriod     string     `json:"quiet_period"`
	Faults          string     `json:"faults"`
	FaultInterval   string     `json:"fault_interval"`
	DownS           [2]float64 `json:"down_s"`
	FreezeS         [2]float64 `json:"freeze_s"`
	Strict          bool       `json:"strict"`
}

// providerSums totals the fake provider's per-key counts.
type providerSums struct {
	Keys           int `json:"keys"`
	Requests       int `json:"requests"`
	Charges        int `json:"charges"`
	Delivered      int `json:"delivered_2xx"`
	AfterDelivered int `json:"requests_after_2xx"`
	Overlaps       int `json:"overlaps"`
}

// faultEntry is a fault with its times as seconds into the run.
type faultEntry struct {
	faultStats
	StartS     float64  `json:"start_s"`
	UndoneS    *float64 `json:"undone_s"`
	RecoveredS float64  `json:"recovered_s"`
	// DownS is from its start to its undoing.
	DownS *float64 `json:"down_s"`
	// Kills are the replicas a compound fault SIGKILLed, and when.
	Kills []killEntry `json:"kills,omitempty"`
}

// killEntry is a kill inside a compound fault, in seconds into the run;
// for a replica sent SIGTERM, AtS is when it exited, TermS when it was
// sent SIGTERM, and Killed that it was SIGKILLed still draining.
type killEntry struct {
	Target string   `json:"target"`
	AtS    float64  `json:"at_s"`
	TermS  *float64 `json:"sigterm_s,omitempty"`
	Killed bool     `json:"killed_draining,omitempty"`
}

func newReport(o *options, args []string, begin, end time.Time, dueAtEnd int, settleWait time.Duration, res checkResult,
	stats map[string]simulator.KeyStats, logs logTally, problems []string) *report {
	r := &report{
		Date: begin.UTC(), Command: args, GoVersion: runtime.Version(), Seed: o.seed,
		Setup: setup{
			Store: o.store, Replicas: o.replicas, Callers: o.callers, ClientCallers: o.clientCallers,
			LatencyMS:       [2]int64{o.latencyMin.Milliseconds(), o.latencyMax.Milliseconds()},
			UpstreamTimeout: o.upstreamTO.String(), QuietPeriod: o.quietPeriod.String(),
			Faults: o.faults, FaultInterval: o.faultInterval.String(),
			DownS: [2]float64{o.downMin.Seconds(), o.downMax.Seconds()}, FreezeS: [2]float64{o.freezeMin.Seconds(), o.freezeMax.Seconds()},
			Strict: o.strict, Provider: o.provider, Careless: o.careless,
		},
		Seconds: end.Sub(begin).Seconds(), SettleSeconds: settleWait.Seconds(), DueAtEnd: dueAtEnd,
		Keys: res.Keys, Calls: res.Calls, Outside: res.Outside,
		Violations: res.Violations, Resends: res.Resends, Problems: problems,
		ViolationCounts: make(map[string]int), Invariants: make(map[string]int), ResendCounts: make(map[string]int),
		WithoutOK: res.WithoutOK, PaymentsdLog: logs,
	}
	if o.store == storePatroni {
		r.Setup.Front, r.Setup.Replication = o.front, o.replication
	}
	if o.careless {
		r.Resolutions = &res.Resolutions
	}
	if r.Resends == nil {
		r.Resends = []violation{}
	}
	for _, inv := range invariants {
		r.Invariants[inv.name] = 0
	}
	broke := make(map[[2]string]bool) // invariant, key
	for _, v := range res.Violations {
		if inv, ok := invariantOf[v.Kind]; ok && !broke[[2]string{inv, v.Key}] {
			broke[[2]string{inv, v.Key}] = true
			r.Invariants[inv]++
		}
	}
	for _, reason := range resendReasons {
		r.ResendCounts[reason] = 0
	}
	for _, v := range res.Resends {
		r.ResendCounts[v.Kind]++
	}
	if r.Violations == nil {
		r.Violations = []violation{}
	}
	for _, k := range violationKinds {
		r.ViolationCounts[k] = 0
	}
	for _, v := range res.Violations {
		r.ViolationCounts[v.Kind]++
	}
	for _, ks := range stats {
		r.Provider.Keys++
		r.Provider.Requests += ks.Requests
		r.Provider.Charges += ks.Charges
		r.Provider.Delivered += ks.Delivered
		r.Provider.AfterDelivered += ks.AfterDelivered
		r.Provider.Overlaps += ks.Overlaps
	}
	for _, fs := range res.Faults {
		e := faultEntry{faultStats: fs, StartS: fs.Start.Sub(begin).Seconds(), RecoveredS: fs.Recovered.Sub(begin).Seconds()}
		if !fs.Undone.IsZero() {
			u, d := fs.Undone.Sub(begin).Seconds(), fs.Undone.Sub(fs.Start).Seconds()
			e.UndoneS, e.DownS = &u, &d
		}
		for _, k := range fs.Kills {
			ke := killEntry{Target: k.Target, AtS: k.At.Sub(begin).Seconds(), Killed: k.Killed}
			if !k.Termed.IsZero() {
				t := k.Termed.Sub(begin).Seconds()
				ke.TermS = &t
			}
			e.Kills = append(e.Kills, ke)
		}
		r.Faults = append(r.Faults, e)
	}
	return r
}

// failed reports whether the run found violations or could not be made
// as asked.
func (r *report) failed() bool { return len(r.Violations) > 0 || len(r.Problems) > 0 }

func printReport(w io.Writer, r *report) {
	s := r.Setup
	fmt.Fprintf(w, "paymentschaos: %d replicas on %s; provider %d–%d ms, a reused key answered %s; %d raw gRPC and %d paymentsclient callers; %.0fs (seed %d)\n",
		s.Replicas, s.Store+frontSuffix(s), s.LatencyMS[0], s.LatencyMS[1], s.Provider, s.Callers, s.ClientCallers, r.Seconds, r.Seed)
	fmt.Fprintf(w, "keys: %d (OK %d, NOT_CREATED %d, in doubt when their callers stopped %d, of which settled afterwards %d); the provider charged %d; settlement's re-sends settled %d\n",
		r.Keys.Total, r.Keys.OK, r.Keys.NotCreated, r.Keys.InDoubt, r.Keys.Settled, r.Keys.Charged, r.Keys.BySettlement)
	rest := ""
	if r.Calls.REST > 0 {
		rest = fmt.Sprintf(", of which %d over REST (%d unanswered: the caller went away)", r.Calls.REST, r.Calls.Left)
	}
	fmt.Fprintf(w, "calls: %d gRPC (%d failed)%s, %d paymentsclient.Create; settlement owed %d keys when callers stopped, waited %.1fs\n",
		r.Calls.Total, r.Calls.Failed, rest, r.Calls.Clients, r.DueAtEnd, r.SettleSeconds)
	fmt.Fprintf(w, "provider: %d requests for %d keys, %d charges, %d 2xx delivered, %d requests after a delivered 2xx, %d overlaps\n",
		r.Provider.Requests, r.Provider.Keys, r.Provider.Charges, r.Provider.Delivered, r.Provider.AfterDelivered, r.Provider.Overlaps)
	fmt.Fprintf(w, "longest time without an OK: %.1fs (from %.1fs to %.1fs)\n", r.WithoutOK.Seconds, r.WithoutOK.From, r.WithoutOK.To)
	if rc := r.Resolutions; rc != nil {
		fmt.Fprintf(w, "careless person: %d resolutions asked, %d accepted, refused: %s; keys recorded NOT_CREATED that the provider had made: %d\n",
			rc.Asked, rc.Accepted, dash(byCount(rc.Refused)), rc.WrongNotCreated)
	}

	fmt.Fprintf(w, "\nfaults: %d\n", len(r.Faults))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\ttarget\tat s\tdown s\tcalls\tfailed\tlongest failed run\tno success s\tp50 ms\tp99 ms\tin doubt\tsettled\tby settlement\t")
	for _, f := range r.Faults {
		down := "not undone"
		if f.DownS != nil {
			down = fmt.Sprintf("%.1f", *f.DownS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%d\t%d\t%d calls, %.1fs\t%.1f\t%.0f\t%.0f\t%d\t%d\t%d\t\n",
			f.Kind, dash(f.Target), f.StartS, down, f.Calls, f.Failed, f.LongestFailedRun, f.LongestFailedRunSeconds,
			f.Unavailable, f.During.P50, f.During.P99, f.InDoubt, f.Settled, f.BySettlement)
	}
	fmt.Fprintf(tw, "outside faults\t\t\t\t%d\t\t\t\t%.0f\t%.0f\t\t\t\t\n", r.Outside.Calls, r.Outside.P50, r.Outside.P99)
	tw.Flush()
	for _, f := range r.Faults {
		if len(f.Kills) > 0 {
			var ks, ts []string
			for _, k := range f.Kills {
				switch {
				case k.TermS == nil:
					ks = append(ks, fmt.Sprintf("%s at %.1fs", k.Target, k.AtS))
				case k.Killed:
					ts = append(ts, fmt.Sprintf("%s at %.1fs (SIGKILLed still draining at %.1fs)", k.Target, *k.TermS, k.AtS))
				default:
					ts = append(ts, fmt.Sprintf("%s at %.1fs (exited at %.1fs)", k.Target, *k.TermS, k.AtS))
				}
			}
			if len(ks) > 0 {
				fmt.Fprintf(w, "  %s at %.1fs SIGKILLed %s\n", f.Kind, f.StartS, strings.Join(ks, ", "))
			}
			if len(ts) > 0 {
				fmt.Fprintf(w, "  %s at %.1fs sent SIGTERM to %s\n", f.Kind, f.StartS, strings.Join(ts, ", "))
			}
		}
		if len(f.FailedBy) > 0 {
			fmt.Fprintf(w, "  %s %s at %.1fs failed: %s\n", f.Kind, dash(f.Target), f.StartS, byCount(f.FailedBy))
		}
	}

	if len(r.PaymentsdLog) > 0 {
		fmt.Fprintln(w, "\npaymentsd warnings and errors:")
		for _, k := range logTally(r.PaymentsdLog).sorted() {
			fmt.Fprintf(w, "  %6d  %s\n", r.PaymentsdLog[k], k)
		}
	}

	fmt.Fprintln(w, "\ninvariants (keys):")
	for _, inv := range invariants {
		verdict := "ok"
		if n := r.Invariants[inv.name]; n > 0 {
			verdict = fmt.Sprintf("%d VIOLATION(S)", n)
		}
		fmt.Fprintf(w, "  %s %-88s %s\n", inv.name, inv.says, verdict)
	}
	fmt.Fprintln(w, "\nchecks:")
	for _, k := range violationKinds {
		verdict := "ok"
		if n := r.ViolationCounts[k]; n > 0 {
			verdict = fmt.Sprintf("%d VIOLATION(S)", n)
		}
		inv := invariantOf[k]
		if inv == "" {
			inv = "-"
		}
		fmt.Fprintf(w, "  %-2s %-32s %s\n", inv, k, verdict)
	}
	fmt.Fprintf(w, "\nkeys sent again after a 2xx the provider wrote: %d\n", len(r.Resends))
	for _, reason := range resendReasons {
		if n := r.ResendCounts[reason]; n > 0 {
			note := ""
			if reason == resendLived || r.Setup.Strict {
				note = " (" + violSentAfter2xx + ")"
			}
			fmt.Fprintf(w, "  %-42s %d%s\n", reason, n, note)
		}
	}
	const show = 20
	if len(r.Violations) > 0 {
		fmt.Fprintf(w, "\nviolations: %d\n", len(r.Violations))
		for i, v := range r.Violations {
			if i == show {
				fmt.Fprintf(w, "  … %d more (see -json)\n", len(r.Violations)-show)
				break
			}
			fmt.Fprintf(w, "  %s %s: %s\n", v.Kind, v.Key, v.Detail)
		}
	}
	if len(r.Resends) > 0 {
		fmt.Fprintf(w, "\nre-sends after a delivered 2xx: %d\n", len(r.Resends))
	}
	for i, v := range r.Resends {
		if i == show {
			fmt.Fprintf(w, "  … %d more (see -json)\n", len(r.Resends)-show)
			break
		}
		fmt.Fprintf(w, "  %s %s: %s\n", v.Kind, v.Key, v.Detail)
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
	}
	if !r.failed() {
		fmt.Fprintln(w, "\nno violations")
	}
}

func frontSuffix(s setup) string {
	if s.Front == "" {
		return ""
	}
	return fmt.Sprintf(" (%s, through %s)", s.Replication, s.Front)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// byCount lists m's entries, most first.
func byCount(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeHistory writes every call, one JSON object a line, its times as
// seconds into the run.
func writeHistory(path string, begin time.Time, calls []call) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for _, c := range calls {
		enc.Encode(struct {
			call
			StartS float64 `json:"start_s"`
			EndS   float64 `json:"end_s"`
			Code   string  `json:"code"`
		}{c, c.Start.Sub(begin).Seconds(), c.End.Sub(begin).Seconds(), c.Code.String()})
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
