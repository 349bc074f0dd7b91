package store_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// TestReadOnlyServerConnectionsDropped: a failover leaves the store's pool
// holding connections to a server that now refuses writes (SQLSTATE
// 25006), as a demoted primary, or a DNS name or proxy still pointing at
// one, does. Each such connection must be dropped at its first refusal, so
// that the next write opens a fresh one, which the multi-host URL's
// target_session_attrs=read-write sends to the new primary; a pool that
// kept them would fail writes for as long as they last.
func TestReadOnlyServerConnectionsDropped(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers")
	}
	ctx := t.Context()
	oldPrimary, newPrimary := storetest.StartCluster(t), storetest.StartCluster(t)
	// The new primary has the schema already, as a replica would.
	s, err := store.Open(ctx, newPrimary.URL, "sandbox", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	multiHost := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
		hostPort(t, oldPrimary.URL), hostPort(t, newPrimary.URL))
	const conns = 8
	s, err = store.Open(ctx, multiHost, "sandbox", store.Options{MaxConns: conns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Fill the pool with connections to the old primary: hold every one
	// at once.
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pay(ctx, s, fmt.Sprintf("before-%d", i)); err != nil {
				t.Errorf("payment before the failover: %v", err)
			}
		}()
	}
	wg.Wait()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Stats(ctx); err != nil {
				t.Errorf("Stats() before the failover: %v", err)
			}
		}()
	}
	wg.Wait()

	setReadOnly(t, oldPrimary.URL)

	// Each pooled connection may fail one write; then every write must
	// land on the new primary.
	failed := 0
	for i := 0; ; i++ {
		err := pay(ctx, s, fmt.Sprintf("after-%d", i))
		if err == nil {
			break
		}
		failed++
		if failed > conns+2 {
			t.Fatalf("%d writes failed after the old primary turned read-only, want at most one per pooled connection (%d); last: %v", failed, conns, err)
		}
	}
	for i := range 3 * conns {
		if err := pay(ctx, s, fmt.Sprintf("later-%d", i)); err != nil {
			t.Fatalf("write %d after one succeeded on the new primary: %v (the pool still holds connections to the read-only server)", i, err)
		}
		if err := s.CheckWrite(ctx); err != nil {
			t.Fatalf("CheckWrite() %d after a write succeeded on the new primary: %v", i, err)
		}
	}
	onNew, err := store.Open(ctx, newPrimary.URL, "sandbox", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer onNew.Close()
	if _, err := onNew.Get(ctx, "later-0"); err != nil {
		t.Errorf("Get(later-0) on the new primary = %v, want the record written after the failover", err)
	}
}

// setReadOnly makes the server at url refuse writes in every session,
// those open included (they read the setting again before their next
// statement), as a primary being demoted does.
func setReadOnly(t *testing.T, url string) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxIdleConns(0) // a new session for each look
	for _, q := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The reload reaches sessions asynchronously: wait until a new one
	// sees it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ro string
		err := db.QueryRow(`SHOW default_transaction_read_only`).Scan(&ro)
		if err == nil && ro == "on" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not turn read-only: %q, %v", ro, err)
		}
		time.Sleep(20 * time.Millisecond) // the reload has no signal to wait on
	}
}

// hostPort is url's host:port.
func hostPort(t *testing.T, url string) string {
	t.Helper()
	_, rest, _ := strings.Cut(url, "@")
	hp, _, _ := strings.Cut(rest, "/")
	return hp
}

// pay records one payment: Begin, then Finish with a success.
func pay(ctx context.Context, s *store.Store, key string) error {
	body := []byte(`{"idempotencyKey":"` + key + `"}`)
	b, err := s.Begin(ctx, record.Claim{Request: record.Request{Key: key, Body: body, BodySHA256: sha256.Sum256(body), Currency: "USD", Amount: 1},
		Owner: "o", LeaseTTL: time.Minute, Window: time.Hour, Quiet: time.Minute}, nil)
	if err != nil {
		return err
	}
	if b.Verdict != record.Acquired {
		return fmt.Errorf("Begin(%s) = %v, want Acquired", key, b.Verdict)
	}
	v, err := s.Finish(ctx, &b.Record, record.Outcome{Owner: "o", Result: record.Paid, HTTPRequests: 1, ProviderStatus: 200, Reply: []byte(`{}`)})
	if err == nil && v != record.Written {
		return fmt.Errorf("Finish(%s) = %v, want Written", key, v)
	}
	return err
}
