package service_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// logLines reads the JSON log lines in logs past the first *seen, and
// moves *seen past them.
func logLines(t *testing.T, logs *syncBuffer, seen *int) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for n := 0; sc.Scan(); n++ {
		if n < *seen {
			continue
		}
		*seen = n + 1
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// replicationMetrics reads paymentsd_store_synchronous_commit and the
// labels of paymentsd_store_replication_info's one series.
func replicationMetrics(t *testing.T, reg *prometheus.Registry) (float64, map[string]string) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v, labels := math.Inf(1), map[string]string{}
	for _, f := range families {
		switch f.GetName() {
		case "paymentsd_store_synchronous_commit":
			v = f.GetMetric()[0].GetGauge().GetValue()
		case "paymentsd_store_replication_info":
			if n := len(f.GetMetric()); n != 1 {
				t.Fatalf("paymentsd_store_replication_info has %d series, want 1", n)
			}
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
		}
	}
	return v, labels
}

// levels lists each line's level, and whether it says what a failover can
// lose (the can_lose attribute).
func levels(lines []map[string]any) []string {
	var out []string
	for _, l := range lines {
		s, _ := l["level"].(string)
		if _, ok := l["can_lose"]; ok {
			s += " can_lose"
		}
		out = append(out, s)
	}
	return out
}

func openStore(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), url, "sandbox", store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestReplicationWatchSQLite(t *testing.T) {
	t.Parallel()
	reg, logs, seen := prometheus.NewRegistry(), &syncBuffer{}, 0
	w := service.NewReplicationWatch(openStore(t, storetest.SQLiteURL(t)), reg, slog.New(slog.NewJSONHandler(logs, nil)))
	if v, _ := replicationMetrics(t, reg); !math.IsNaN(v) {
		t.Errorf("paymentsd_store_synchronous_commit before any read = %v, want NaN", v)
	}
	if _, err := w.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	v, labels := replicationMetrics(t, reg)
	if v != 1 {
		t.Errorf("paymentsd_store_synchronous_commit on SQLite = %v, want 1", v)
	}
	if labels["backend"] != "sqlite" {
		t.Errorf("paymentsd_store_replication_info labels = %v, want backend sqlite", labels)
	}
	// A local file never fails over: nothing to warn of, and nothing
	// logged.
	if diff := cmp.Diff([]string(nil), levels(logLines(t, logs, &seen))); diff != "" {
		t.Errorf("log levels (-want +got):\n%s", diff)
	}
}

// TestReplicationWatchPostgres runs the watch against a real PostgreSQL
// server whose settings change under it: alone (not synchronous: the
// start-up line warns what a failover can lose), then waiting for a
// synchronous standby that is not there (synchronous, and a warning that
// commits wait), then alone again; a server that goes away leaves the
// metrics as they were, with one warning, and the next change is still
// seen once it is back.
func TestReplicationWatchPostgres(t *testing.T) {
	t.Parallel()
	c := storetest.StartCluster(t)
	s := openStore(t, c.URL)
	admin, err := sql.Open("pgx", c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	// The server is stopped and started below: a connection kept idle
	// across that is dead (57P01) when next used. Each statement opens
	// its own.
	admin.SetMaxIdleConns(0)
	setNames := func(names string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '` + names + `'`, `SELECT pg_reload_conf()`} {
			if _, err := admin.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	t.Cleanup(func() { setNames("") }) // release the heartbeat's commits before the store closes

	reg, logs, seen := prometheus.NewRegistry(), &syncBuffer{}, 0
	w := service.NewReplicationWatch(s, reg, slog.New(slog.NewJSONHandler(logs, nil)))
	ctx, stop := context.WithCancel(t.Context())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		w.Watch(ctx, 10*time.Millisecond)
	}()
	t.Cleanup(func() { stop(); <-watched })
	// awaitMetric waits until the watch has exported want.
	awaitMetric := func(want float64, names string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			v, labels := replicationMetrics(t, reg)
			if v == want && labels["synchronous_standby_names"] == names {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("paymentsd_store_synchronous_commit = %v with %v after 30s, want %v with synchronous_standby_names %q", v, labels, want, names)
			}
			time.Sleep(5 * time.Millisecond) // the watch's next read
		}
	}

	// The start-up read, as cmd/paymentsd makes it before serving.
	r, err := w.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.Synchronous() {
		t.Errorf("Check() = %+v, synchronous; want not, on a lone server", r)
	}
	awaitMetric(0, "")
	wantLabels := map[string]string{"backend": "postgres", "synchronous_commit": "on", "synchronous_standby_names": "", "standbys": "0", "sync_standbys": "0"}
	if _, labels := replicationMetrics(t, reg); !cmp.Equal(labels, wantLabels) {
		t.Errorf("paymentsd_store_replication_info labels = %v, want %v", labels, wantLabels)
	}
	if diff := cmp.Diff([]string{"WARN can_lose"}, levels(logLines(t, logs, &seen))); diff != "" {
		t.Errorf("start-up log levels on a lone server (-want +got):\n%s", diff)
	}

	setNames("n2")
	awaitMetric(1, "n2")
	if diff := cmp.Diff([]string{"WARN"}, levels(logLines(t, logs, &seen))); diff != "" {
		t.Errorf("log levels once commits wait for an absent standby (-want +got):\n%s", diff)
	}

	c.Stop("fast")
	ctxFailed, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	_, err = w.Check(ctxFailed)
	cancel()
	if err == nil {
		t.Fatal("Check() with the server stopped = nil error")
	}
	c.Start()
	setNames("")
	awaitMetric(0, "")
	got := levels(logLines(t, logs, &seen))
	// One warning for the failed reads, however many the watch made, then
	// the change.
	if diff := cmp.Diff([]string{"WARN", "WARN can_lose"}, got); diff != "" {
		t.Errorf("log levels across the outage (-want +got):\n%s", diff)
	}
}
