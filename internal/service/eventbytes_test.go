package service_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// deliverWith posts body with the given headers, as bytes, and fails the
// test unless it is acknowledged.
func (r *replica) deliverWith(t *testing.T, header http.Header, body []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.hookURL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("deliver = %d, want 200", resp.StatusCode)
	}
}

// restPage reads GET /v1/provider-events with query and decodes it as the
// API's JSON.
func (r *replica) restPage(t *testing.T, query string) *paymentsv1.ListProviderEventsResponse {
	t.Helper()
	resp, err := http.Get(r.restURL + "/v1/provider-events?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/provider-events?%s = %d %s, want 200", query, resp.StatusCode, b)
	}
	var page paymentsv1.ListProviderEventsResponse
	if err := protojson.Unmarshal(b, &page); err != nil {
		t.Fatalf("GET /v1/provider-events?%s is not the API's JSON: %v", query, err)
	}
	return &page
}

// TestEventsWhateverBytesTheSenderSent: a delivery whose Content-Type held
// a byte that is not UTF-8 was stored by SQLite, and from then on every
// gRPC List and Watch that reached it failed with INTERNAL (protobuf
// refuses such a string) and REST with 500; PostgreSQL refused it with 503
// for ever. Now it is stored on both, and read everywhere: as text with
// U+FFFD, and exactly as bytes.
func TestEventsWhateverBytesTheSenderSent(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		url  func(testing.TB) string
	}{{"sqlite", storetest.SQLiteURL}, {"postgres", storetest.PostgresURL}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			r := startReplica(t, b.url(t), time.Hour)
			const contentType = "application/json; charset=\xe9"
			r.deliverWith(t, http.Header{"Content-Type": {contentType}, "X-Odd": {"\xff\xfe ok"}}, []byte(`{"a":1}`))
			r.deliver(t, "text/plain", []byte("after"))

			check := func(how string, e *paymentsv1.ProviderEvent) {
				t.Helper()
				if e.GetContentType() != "application/json; charset=\uFFFD" || string(e.GetContentTypeBytes()) != contentType {
					t.Errorf("%s: content_type, content_type_bytes = %q, %q; want %q, %q", how, e.GetContentType(), e.GetContentTypeBytes(), "application/json; charset=\uFFFD", contentType)
				}
				var odd *paymentsv1.HttpHeader
				for _, h := range e.GetHeaders() {
					if h.GetName() == "X-Odd" {
						odd = h
					}
				}
				if odd.GetValue() != "\uFFFD ok" || string(odd.GetValueBytes()) != "\xff\xfe ok" {
					t.Errorf("%s: X-Odd = %q, %q; want text with U+FFFD and the exact bytes", how, odd.GetValue(), odd.GetValueBytes())
				}
			}
			list, err := r.client.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
			if err != nil || len(list.GetEvents()) != 2 {
				t.Fatalf("ListProviderEvents() = %d events, %v; want 2", len(list.GetEvents()), err)
			}
			check("gRPC List", list.GetEvents()[0])
			page := r.restPage(t, "afterSequence=0")
			if len(page.GetEvents()) != 2 {
				t.Fatalf("REST list = %d events, want 2", len(page.GetEvents()))
			}
			check("REST", page.GetEvents()[0])
			stream, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			check("Watch", recv(t, stream))
			if got := recv(t, stream).GetSequence(); got != 2 {
				t.Errorf("Watch's second event = %d, want 2: the watch goes on past it", got)
			}
			http.DefaultClient.CloseIdleConnections()
		})
	}
}

// TestPagesFitADefaultClient: a List page of 100 events of 256 KiB was 26
// MB, over a gRPC client's default 4 MiB limit (RESOURCE_EXHAUSTED), and
// one 5 MB event stopped List and Watch for such clients for good. Now a
// page is at most MaxEventPageBytes, each event is within
// inbox.LargestMaxBytes, and an event stored larger than a page before
// that cap comes without its body.
func TestPagesFitADefaultClient(t *testing.T) {
	t.Parallel()
	r := startReplicaWith(t, storetest.SQLiteURL(t), time.Hour, inbox.LargestMaxBytes)
	var want [][]byte
	for i := range 24 {
		n := 100
		if i%3 == 0 {
			n = inbox.LargestMaxBytes
		}
		body := make([]byte, n)
		rand.Read(body)
		r.deliver(t, "application/octet-stream", body)
		want = append(want, body)
	}
	// An event as an older paymentsd, with PAYMENTS_WEBHOOK_MAX_BYTES up to
	// 16 MiB, stored it.
	huge := bytes.Repeat([]byte("h"), 5<<20)
	if _, err := r.store.AppendEvent(t.Context(), store.Event{ReceivedAt: time.Now(), Body: huge, BodySHA256: sha256.Sum256(huge)}); err != nil {
		t.Fatal(err)
	}
	r.deliver(t, "text/plain", []byte("last"))
	want = append(want, nil, []byte("last"))

	checkAll := func(how string, got []*paymentsv1.ProviderEvent) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d events, want %d", how, len(got), len(want))
		}
		for i, e := range got {
			if e.GetSequence() != int64(i+1) || !bytes.Equal(e.GetBody(), want[i]) {
				t.Errorf("%s: event %d: sequence %d, %d body bytes; want sequence %d, %d bytes", how, i, e.GetSequence(), len(e.GetBody()), i+1, len(want[i]))
			}
			sum := sha256.Sum256(huge)
			if i == len(want)-2 && (!e.GetBodyOmitted() || e.GetBodySha256() != hex.EncodeToString(sum[:])) {
				t.Errorf("%s: the 5 MiB event: body_omitted %v, body_sha256 %s; want true, the body's", how, e.GetBodyOmitted(), e.GetBodySha256())
			}
		}
	}

	var listed []*paymentsv1.ProviderEvent
	var after int64
	for {
		resp, err := r.client.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{AfterSequence: after, PageSize: 1000})
		if err != nil {
			t.Fatalf("ListProviderEvents(after %d, 1000) with a default client = %v", after, err)
		}
		if n := proto.Size(resp); n > service.MaxEventPageBytes+64 {
			t.Errorf("page after %d is %d bytes, want at most %d", after, n, service.MaxEventPageBytes)
		}
		if len(resp.GetEvents()) == 0 {
			break
		}
		listed = append(listed, resp.GetEvents()...)
		after = resp.GetNextAfterSequence()
	}
	checkAll("List", listed)

	// REST pages the same way and says the same, in the API's JSON; its
	// pages are released once written, or the third would wait for room.
	var restListed []*paymentsv1.ProviderEvent
	after = 0
	for {
		page := r.restPage(t, "pageSize=1000&afterSequence="+strconv.FormatInt(after, 10))
		if len(page.GetEvents()) == 0 {
			break
		}
		restListed = append(restListed, page.GetEvents()...)
		after = page.GetNextAfterSequence()
	}
	// proto.Equal: cmp would compare the MiB bodies byte by byte.
	if len(restListed) != len(listed) {
		t.Errorf("REST pages hold %d events, gRPC's %d", len(restListed), len(listed))
	}
	for i := range min(len(listed), len(restListed)) {
		if !proto.Equal(listed[i], restListed[i]) {
			t.Errorf("REST event %d differs from gRPC's", listed[i].GetSequence())
		}
	}

	stream, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var watched []*paymentsv1.ProviderEvent
	for range want {
		watched = append(watched, recv(t, stream))
	}
	checkAll("Watch", watched)
	http.DefaultClient.CloseIdleConnections()
}
