package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"example.com/paymentsd/internal/store"
)

// recordFloor is what every service with durable records must add to its
// floor, and no more: one INSERT of the request, committed before the
// request is forwarded, and one UPDATE with the answer, committed before
// it answers (as paymentsd's record of an outcome is). Both go through
// store.Store.FloorExec, so they run with paymentsd's driver, pragmas
// (WAL, synchronous=FULL) and group commit, on a table of their
// own in a database opened by store.Open. The floors run with it when
// given -db (see runFloor).
type recordFloor struct{ st *store.Store }

// floorTable is the record floor's table: the key, the request, the
// state, and the provider's answer.
func floorTable(backend string) string {
	blob := "BLOB"
	if backend == "postgres" {
		blob = "BYTEA"
	}
	return `CREATE TABLE IF NOT EXISTS floor_records (
		key        TEXT PRIMARY KEY,
		body       ` + blob + ` NOT NULL,
		state      INTEGER NOT NULL,
		status     INTEGER NOT NULL DEFAULT 0,
		reply      ` + blob + `,
		created_at BIGINT NOT NULL,
		updated_at BIGINT NOT NULL
	)`
}

// openRecordFloor opens the store at dbURL and creates the floor's table.
func openRecordFloor(ctx context.Context, dbURL string) (*recordFloor, error) {
	st, err := store.Open(ctx, dbURL, "sandbox", store.Options{})
	if err != nil {
		return nil, err
	}
	if err := st.FloorExec(ctx, floorTable(st.Backend())); err != nil {
		st.Close()
		return nil, fmt.Errorf("create floor_records: %w", err)
	}
	return &recordFloor{st: st}, nil
}

// begin records key's request durably.
func (f *recordFloor) begin(ctx context.Context, key string, body []byte) error {
	now := time.Now().UnixMicro()
	return f.st.FloorExec(ctx, `INSERT INTO floor_records (key, body, state, created_at, updated_at) VALUES ($1, $2, 1, $3, $3)`,
		key, body, now)
}

// finish records the provider's answer to key's request, and returns once
// it is durable, as paymentsd's record of an outcome is before paymentsd
// answers (it commits in the next group commit). A failed UPDATE ends the
// floor: a measuring stick that loses records measures nothing.
func (f *recordFloor) finish(key string, status int, reply []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := f.st.FloorExec(ctx, `UPDATE floor_records SET state = 2, status = $2, reply = $3, updated_at = $4 WHERE key = $1`,
		key, status, reply, time.Now().UnixMicro())
	if err != nil {
		fmt.Fprintf(os.Stderr, "record floor: UPDATE %q: %v\n", key, err)
		os.Exit(1)
	}
}

func (f *recordFloor) close() error { return f.st.Close() }

// floorKey carries the idempotency key from the record floor's handler to
// the ReverseProxy's ModifyResponse.
type floorKey struct{}

// recordingHandler reads the body, takes its idempotency key, records it
// and then hands the request to proxy.
func (f *recordFloor) recordingHandler(proxy http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req struct {
			IdempotencyKey string `json:"idempotencyKey"`
		}
		if err := json.Unmarshal(body, &req); err != nil || req.IdempotencyKey == "" {
			http.Error(w, "want a JSON body with an idempotencyKey", http.StatusBadRequest)
			return
		}
		if err := f.begin(r.Context(), req.IdempotencyKey, body); err != nil {
			http.Error(w, "record: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), floorKey{}, req.IdempotencyKey)))
	})
}

// recordResponse is the ReverseProxy's ModifyResponse: it reads the
// answer, records it, and passes it on.
func (f *recordFloor) recordResponse(resp *http.Response) error {
	key, _ := resp.Request.Context().Value(floorKey{}).(string)
	if key == "" {
		return errors.New("no idempotency key in the request's context")
	}
	reply, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	f.finish(key, resp.StatusCode, reply)
	resp.Body = io.NopCloser(bytes.NewReader(reply))
	resp.ContentLength = int64(len(reply))
	return nil
}
