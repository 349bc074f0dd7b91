package store_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"example.com/paymentsd/internal/store"
)

func event(contentType, body string, hs ...store.Header) store.Event {
	return store.Event{ReceivedAt: t0, ContentType: contentType, Headers: hs, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}
}

func appendEvent(t *testing.T, s *store.Store, e store.Event) store.Event {
	t.Helper()
	got, err := s.AppendEvent(context.Background(), e)
	if err != nil {
		t.Fatalf("AppendEvent(%d bytes) error = %v", len(e.Body), err)
	}
	return got
}

func listEvents(t *testing.T, s *store.Store, q store.EventQuery) []store.Event {
	t.Helper()
	got, err := s.ListEvents(context.Background(), q)
	if err != nil {
		t.Fatalf("ListEvents(%+v) error = %v", q, err)
	}
	return got
}

func sequences(es []store.Event) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Sequence)
	}
	return out
}

// testInbox is the webhook inbox's part of the conformance suite.
func testInbox(t *testing.T, b backend) {
	ctx := context.Background()
	fresh := func(t *testing.T, opts store.Options) *store.Store {
		t.Helper()
		s, err := store.Open(ctx, b.url(t), "sandbox", opts)
		if err != nil {
			t.Fatalf("Open() error = %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}

	// Whatever bytes a sender puts in a header or its Content-Type, the
	// event is stored (PostgreSQL's text refused invalid UTF-8: SQLSTATE
	// 22021) and read back exactly.
	t.Run("EventBytesExact", func(t *testing.T) {
		t.Parallel()
		s := fresh(t, store.Options{})
		e := event("application/json; charset=\xe9", "{}",
			store.Header{Name: "Content-Type", Value: "application/json; charset=\xe9"},
			store.Header{Name: "X-Bytes", Value: "\xff\xfe\x80 \x00 end"},
			store.Header{Name: "X-Utf8", Value: "grüße"},
			store.Header{Name: "X-Empty", Value: ""},
		)
		got := appendEvent(t, s, e)
		list := listEvents(t, s, store.EventQuery{Limit: 10})
		if len(list) != 1 {
			t.Fatalf("ListEvents() = %d events, want 1", len(list))
		}
		if diff := cmp.Diff(got, list[0]); diff != "" {
			t.Errorf("ListEvents() event differs from AppendEvent's (-appended +listed):\n%s", diff)
		}
		if list[0].ContentType != e.ContentType {
			t.Errorf("ContentType = %q, want %q", list[0].ContentType, e.ContentType)
		}
		if diff := cmp.Diff(e.Headers, list[0].Headers); diff != "" {
			t.Errorf("Headers (-want +got):\n%s", diff)
		}
	})

	t.Run("ListEventsByBytes", func(t *testing.T) {
		t.Parallel()
		s := fresh(t, store.Options{})
		var sizes []int64
		for _, n := range []int{100, 1000, 5000, 100, 20000, 100} {
			sizes = append(sizes, appendEvent(t, s, event("text/plain", string(bytes.Repeat([]byte{'x'}, n)))).Size)
		}
		tests := []struct {
			name string
			q    store.EventQuery
			want []int64
		}{
			{"no budget", store.EventQuery{Limit: 10}, []int64{1, 2, 3, 4, 5, 6}},
			{"limit first", store.EventQuery{Limit: 2, MaxBytes: 1 << 20}, []int64{1, 2}},
			{"exactly two", store.EventQuery{Limit: 10, MaxBytes: sizes[0] + sizes[1]}, []int64{1, 2}},
			{"a byte short of two", store.EventQuery{Limit: 10, MaxBytes: sizes[0] + sizes[1] - 1}, []int64{1}},
			{"first over the budget still comes", store.EventQuery{After: 4, Limit: 10, MaxBytes: 10}, []int64{5}},
			{"stops before the large one", store.EventQuery{After: 3, Limit: 10, MaxBytes: sizes[3] + 1000}, []int64{4}},
		}
		for _, tt := range tests {
			got := listEvents(t, s, tt.q)
			if diff := cmp.Diff(tt.want, sequences(got)); diff != "" {
				t.Errorf("%s: ListEvents(%+v) sequences (-want +got):\n%s", tt.name, tt.q, diff)
			}
			for _, e := range got {
				if e.BodyOmitted || int64(len(e.Body)) >= e.Size || e.Size != sizes[e.Sequence-1] {
					t.Errorf("%s: event %d BodyOmitted %v, body %d bytes, Size %d; want the body, Size %d", tt.name, e.Sequence, e.BodyOmitted, len(e.Body), e.Size, sizes[e.Sequence-1])
				}
			}
		}
		// An event over OmitBodyOver comes without its body, and its
		// neighbours with theirs.
		got := listEvents(t, s, store.EventQuery{After: 3, Limit: 3, MaxBytes: 1 << 20, OmitBodyOver: 10000})
		if diff := cmp.Diff([]int64{4, 5, 6}, sequences(got)); diff != "" {
			t.Fatalf("ListEvents(omit over 10000) sequences (-want +got):\n%s", diff)
		}
		for _, e := range got {
			wantOmitted := e.Sequence == 5
			if e.BodyOmitted != wantOmitted || (len(e.Body) == 0) != wantOmitted || e.Size != sizes[e.Sequence-1] {
				t.Errorf("ListEvents(omit over 10000) event %d BodyOmitted %v with %d body bytes, Size %d; want omitted %v, Size %d",
					e.Sequence, e.BodyOmitted, len(e.Body), e.Size, wantOmitted, sizes[e.Sequence-1])
			}
			if e.BodySHA256 != sha256.Sum256(bytes.Repeat([]byte{'x'}, []int{100, 1000, 5000, 100, 20000, 100}[e.Sequence-1])) {
				t.Errorf("event %d BodySHA256 is not its body's", e.Sequence)
			}
		}
	})

	t.Run("InboxQuota", func(t *testing.T) {
		t.Parallel()
		probe := fresh(t, store.Options{})
		size := appendEvent(t, probe, event("text/plain", "0123456789")).Size
		// The store's clock an hour after the events arrived: retention of
		// an hour makes them all due.
		s := fresh(t, store.Options{InboxQuota: 3 * size, Now: func() time.Time { return t0.Add(time.Hour + time.Microsecond) }})
		for i := range 3 {
			appendEvent(t, s, event("text/plain", fmt.Sprintf("%010d", i)))
		}
		if _, err := s.AppendEvent(ctx, event("text/plain", "over quota")); !errors.Is(err, store.ErrInboxFull) {
			t.Fatalf("AppendEvent past the quota error = %v, want ErrInboxFull", err)
		}
		if n, err := s.LastSequence(ctx); err != nil || n != 3 {
			t.Errorf("LastSequence() after a refusal = %d, %v; want 3 (nothing written)", n, err)
		}
		u, err := s.InboxUsage(ctx)
		if err != nil || u.StoredBytes != 3*size || u.Quota != 3*size {
			t.Errorf("InboxUsage() = %+v, %v; want %d stored of a quota of %d", u, err, 3*size, 3*size)
		}
		// Deleting events (retention) makes room again.
		if _, err := s.DeleteExpired(ctx, store.Retention{Records: time.Hour}, 1); err != nil {
			t.Fatal(err)
		}
		if u, err := s.InboxUsage(ctx); err != nil || u.StoredBytes != 2*size {
			t.Errorf("InboxUsage() after deleting one = %+v, %v; want %d stored", u, err, 2*size)
		}
		appendEvent(t, s, event("text/plain", "room again"))
	})

	t.Run("InboxReserve", func(t *testing.T) {
		t.Parallel()
		s := fresh(t, store.Options{})
		u, err := s.InboxUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.name != "sqlite" || !b.persistent {
			if u.VolumeFree != -1 {
				t.Errorf("InboxUsage().VolumeFree = %d, want -1 (no volume to see)", u.VolumeFree)
			}
			return
		}
		if u.VolumeFree <= 0 || u.Reserve != store.DefaultInboxReserve {
			t.Errorf("InboxUsage() = %+v, want the volume's free space and the default reserve", u)
		}
		// A reserve larger than the volume leaves the inbox nothing.
		full := fresh(t, store.Options{InboxReserve: 1 << 62})
		if _, err := full.AppendEvent(ctx, event("text/plain", "x")); !errors.Is(err, store.ErrInboxFull) {
			t.Errorf("AppendEvent with the volume at the reserve error = %v, want ErrInboxFull", err)
		}
	})

	t.Run("CheckWrite", func(t *testing.T) {
		t.Parallel()
		s, err := store.Open(ctx, b.url(t), "sandbox", store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.CheckWrite(ctx); err != nil {
				t.Errorf("CheckWrite() error = %v", err)
			}
		}
		s.Close()
		if err := s.CheckWrite(ctx); err == nil {
			t.Error("CheckWrite() on a closed store = nil, want an error")
		}
	})
}
