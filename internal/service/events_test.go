package service_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

const webhookToken = "tok_SENTINEL_0123456789abcdefghijklmnop"

// replica is one paymentsd's inbox: the intake and the events service over
// one store, both on loopback listeners.
type replica struct {
	store    *store.Store
	events   *service.Events
	server   *service.Server
	client   paymentsv1.ProviderEventsServiceClient
	restURL  string
	hookURL  string
	registry *prometheus.Registry
	logs     *syncBuffer
}

// startReplica serves the inbox in the database at url. poll is the watch
// poll interval.
func startReplica(t *testing.T, url string, poll time.Duration) *replica {
	t.Helper()
	return startReplicaWith(t, url, poll, 0)
}

// startReplicaWith is startReplica whose intake takes bodies of up to
// maxBytes (0: the default).
func startReplicaWith(t *testing.T, url string, poll time.Duration, maxBytes int64) *replica {
	t.Helper()
	st, err := store.Open(t.Context(), url, "sandbox", store.Options{})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	r := &replica{store: st, registry: prometheus.NewRegistry(), logs: &syncBuffer{}}
	logger := slog.New(slog.NewJSONHandler(r.logs, nil))
	r.events, err = service.NewEvents(st, paymentsv1.Environment_ENVIRONMENT_SANDBOX, service.EventsOptions{
		EveryoneReads: true, // the reader gate is tested in cmd/paymentsd

		Registerer:   r.registry,
		Logger:       logger,
		PollInterval: poll,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.server, err = service.NewServer(panicky{}, service.Options{
		Logger:          logger,
		Registerer:      r.registry,
		Gatherer:        r.registry,
		MaxRequestBytes: 64 << 10,
		Events:          r.events,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.server.GRPC.Serve(ln)
	t.Cleanup(func() {
		r.events.Close()
		r.server.GRPC.GracefulStop()
	})
	hs := httptest.NewServer(r.server.HTTP)
	t.Cleanup(hs.Close)
	r.restURL = hs.URL
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.client = paymentsv1.NewProviderEventsServiceClient(conn)

	h, err := inbox.New(inbox.Config{
		Tokens:   []string{webhookToken},
		Store:    st,
		MaxBytes: maxBytes,
		Appended: r.events.Appended,
		Logger:   logger,
		Metrics:  inbox.NewMetrics(r.registry),
	})
	if err != nil {
		t.Fatal(err)
	}
	hooks := httptest.NewServer(h)
	t.Cleanup(hooks.Close)
	r.hookURL = hooks.URL + inbox.PathPrefix + webhookToken
	return r
}

// deliver posts a webhook delivery and fails the test unless it is
// acknowledged.
func (r *replica) deliver(t *testing.T, contentType string, body []byte) {
	t.Helper()
	resp, err := http.Post(r.hookURL, contentType, strings.NewReader(string(body)))
	if err != nil {
		t.Errorf("deliver: %v", err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("deliver = %d, want 200", resp.StatusCode)
	}
}

func wantEvent(seq int64, contentType string, body []byte) *paymentsv1.ProviderEvent {
	sum := sha256.Sum256(body)
	return &paymentsv1.ProviderEvent{
		Sequence:         seq,
		ContentType:      contentType,
		ContentTypeBytes: []byte(contentType),
		Body:             body,
		BodySha256:       hex.EncodeToString(sum[:]),
		Environment:      paymentsv1.Environment_ENVIRONMENT_SANDBOX,
	}
}

// eventOpts compares events on everything but the receive time and the
// headers, which the intake's own tests check.
var eventOpts = cmp.Options{
	protocmp.Transform(),
	protocmp.IgnoreFields(&paymentsv1.ProviderEvent{}, "receive_time", "headers"),
}

func TestEventsListedOverGRPCAndREST(t *testing.T) {
	t.Parallel()
	r := startReplica(t, storetest.SQLiteURL(t), time.Hour)
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0x80}
	const odd = "application/x-odd; v=\"1\""
	r.deliver(t, odd, binary)
	r.deliver(t, "application/json", []byte(`{"a":1}`))
	r.deliver(t, odd, binary)
	want := []*paymentsv1.ProviderEvent{
		wantEvent(1, odd, binary),
		wantEvent(2, "application/json", []byte(`{"a":1}`)),
		wantEvent(3, odd, binary),
	}
	want[2].DuplicateOf = 1

	t.Run("gRPC", func(t *testing.T) {
		resp, err := r.client.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
		if err != nil {
			t.Fatalf("ListProviderEvents() = %v", err)
		}
		if diff := cmp.Diff(want, resp.GetEvents(), eventOpts); diff != "" {
			t.Errorf("ListProviderEvents() events (-want +got):\n%s", diff)
		}
		if resp.GetNextAfterSequence() != 3 {
			t.Errorf("ListProviderEvents() next_after_sequence = %d, want 3", resp.GetNextAfterSequence())
		}
		for _, e := range resp.GetEvents() {
			if e.GetReceiveTime() == nil || e.GetVerified() {
				t.Errorf("event %d receive_time = %v, verified = %v; want set, false", e.GetSequence(), e.GetReceiveTime(), e.GetVerified())
			}
		}
		// Paging.
		page, err := r.client.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{AfterSequence: 1, PageSize: 1})
		if err != nil {
			t.Fatalf("ListProviderEvents(after 1, size 1) = %v", err)
		}
		if diff := cmp.Diff(want[1:2], page.GetEvents(), eventOpts); diff != "" || page.GetNextAfterSequence() != 2 {
			t.Errorf("ListProviderEvents(after 1, size 1) next = %d, events (-want +got):\n%s", page.GetNextAfterSequence(), diff)
		}
		end, err := r.client.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{AfterSequence: 3})
		if err != nil || len(end.GetEvents()) != 0 || end.GetNextAfterSequence() != 3 {
			t.Errorf("ListProviderEvents(after 3) = %v, %v; want no events, next 3", end, err)
		}
	})

	t.Run("REST", func(t *testing.T) {
		resp, err := http.Get(r.restURL + "/v1/provider-events?afterSequence=0&pageSize=10")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/provider-events = %d, want 200", resp.StatusCode)
		}
		var got struct {
			Events []struct {
				Sequence    string `json:"sequence"`
				ContentType string `json:"contentType"`
				Body        string `json:"body"`
				BodySHA256  string `json:"bodySha256"`
				DuplicateOf string `json:"duplicateOf"`
				Verified    bool   `json:"verified"`
				Environment string `json:"environment"`
			} `json:"events"`
			NextAfterSequence string `json:"nextAfterSequence"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatalf("GET /v1/provider-events: %v", err)
		}
		if len(got.Events) != 3 || got.NextAfterSequence != "3" {
			t.Fatalf("GET /v1/provider-events = %+v, want 3 events, next 3", got)
		}
		for i, e := range got.Events {
			body, err := base64.StdEncoding.DecodeString(e.Body)
			if err != nil || string(body) != string(want[i].GetBody()) {
				t.Errorf("event %d body = %q (%v), want %q", i+1, body, err, want[i].GetBody())
			}
			if e.Sequence != fmt.Sprint(i+1) || e.ContentType != want[i].GetContentType() || e.BodySHA256 != want[i].GetBodySha256() ||
				e.DuplicateOf != fmt.Sprint(want[i].GetDuplicateOf()) || e.Verified || e.Environment != "ENVIRONMENT_SANDBOX" {
				t.Errorf("event %d = %+v, want %v", i+1, e, want[i])
			}
		}
	})
	http.DefaultClient.CloseIdleConnections()
}

func TestListProviderEventsValidation(t *testing.T) {
	t.Parallel()
	r := startReplica(t, storetest.SQLiteURL(t), time.Hour)
	for _, req := range []*paymentsv1.ListProviderEventsRequest{{PageSize: 1001}, {PageSize: -1}, {AfterSequence: -1}} {
		if _, err := r.client.ListProviderEvents(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ListProviderEvents(%v) code = %v, want InvalidArgument", req, status.Code(err))
		}
	}
	resp, err := http.Get(r.restURL + "/v1/provider-events?pageSize=1001")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /v1/provider-events?pageSize=1001 = %d, want 400", resp.StatusCode)
	}
	// REST went through the interceptor chain: it has an access log line.
	if !strings.Contains(r.logs.String(), `"method":"/payments.v1.ProviderEventsService/ListProviderEvents","code":"InvalidArgument"`) {
		t.Errorf("no access log line for the REST call:\n%s", r.logs.String())
	}
	stream, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{AfterSequence: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("WatchProviderEvents(after -1) code = %v, want InvalidArgument", status.Code(err))
	}
	http.DefaultClient.CloseIdleConnections()
}

// recv receives one event from stream or fails the test.
func recv(t *testing.T, stream grpc.ServerStreamingClient[paymentsv1.WatchProviderEventsResponse]) *paymentsv1.ProviderEvent {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("WatchProviderEvents Recv() = %v", err)
	}
	return resp.GetEvent()
}

func TestWatchReceivesEventDeliveredAfterOpen(t *testing.T) {
	t.Parallel()
	// An hour's poll: only the intake's wake-up can deliver in time.
	r := startReplica(t, storetest.SQLiteURL(t), time.Hour)
	r.deliver(t, "text/plain", []byte("before"))
	stream, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantEvent(1, "text/plain", []byte("before")), recv(t, stream), eventOpts); diff != "" {
		t.Errorf("first watched event (-want +got):\n%s", diff)
	}
	if v := gauge(t, r.registry, "paymentsd_provider_event_watches_open"); v != 1 {
		t.Errorf("paymentsd_provider_event_watches_open = %v, want 1", v)
	}
	r.deliver(t, "text/plain", []byte("after"))
	if diff := cmp.Diff(wantEvent(2, "text/plain", []byte("after")), recv(t, stream), eventOpts); diff != "" {
		t.Errorf("second watched event (-want +got):\n%s", diff)
	}

	// Resuming from a cursor sends only what follows it.
	resumed, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{AfterSequence: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, resumed).GetSequence(); got != 2 {
		t.Errorf("WatchProviderEvents(after 1) first sequence = %d, want 2", got)
	}
}

func TestWatchEndsOnClose(t *testing.T) {
	t.Parallel()
	r := startReplica(t, storetest.SQLiteURL(t), time.Hour)
	r.deliver(t, "text/plain", []byte("x"))
	stream, err := r.client.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, stream) // the watch is open
	stopped := make(chan struct{})
	go func() {
		r.events.Close()
		r.server.GRPC.GracefulStop()
		close(stopped)
	}()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv() after Close = %v, want Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("GracefulStop did not return with a watch open")
	}
}

// gauge returns the value of an unlabelled gauge or counter in reg.
func gauge(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestConcurrentDeliveriesNeverSkipped delivers concurrently to one replica
// on PostgreSQL, where sequences are assigned before commits and commits
// land out of order, while a watcher on that replica and one on another
// replica (which learns of events only by polling) read. Each must see
// every sequence 1..N once, in order.
func TestConcurrentDeliveriesNeverSkipped(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	a := startReplica(t, url, time.Hour)
	b := startReplica(t, url, 10*time.Millisecond)

	const n = 200
	// Bounds the readers if a delivery fails and they would wait forever.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	watch := func(r *replica) <-chan []int64 {
		stream, err := r.client.WatchProviderEvents(ctx, &paymentsv1.WatchProviderEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := make(chan []int64, 1)
		go func() {
			var seen []int64
			for len(seen) < n {
				resp, err := stream.Recv()
				if err != nil {
					t.Errorf("Recv() after %d events = %v", len(seen), err)
					break
				}
				seen = append(seen, resp.GetEvent().GetSequence())
			}
			out <- seen
		}()
		return out
	}
	seenA, seenB := watch(a), watch(b)
	// A lister paging with its cursor while deliveries commit.
	listed := make(chan []int64, 1)
	go func() {
		var seen []int64
		var after int64
		for len(seen) < n {
			resp, err := b.client.ListProviderEvents(ctx, &paymentsv1.ListProviderEventsRequest{AfterSequence: after, PageSize: 7})
			if err != nil {
				t.Errorf("ListProviderEvents(after %d) = %v", after, err)
				break
			}
			for _, e := range resp.GetEvents() {
				seen = append(seen, e.GetSequence())
			}
			after = resp.GetNextAfterSequence()
		}
		listed <- seen
	}()

	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			a.deliver(t, "text/plain", fmt.Appendf(nil, "delivery %d", i))
		})
	}
	wg.Wait()
	http.DefaultClient.CloseIdleConnections()

	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for name, ch := range map[string]<-chan []int64{"same replica": seenA, "other replica": seenB} {
		if diff := cmp.Diff(want, <-ch); diff != "" {
			t.Errorf("%s watcher saw (-want +got):\n%s", name, diff)
		}
	}
	if diff := cmp.Diff(want, <-listed); diff != "" {
		t.Errorf("lister saw (-want +got):\n%s", diff)
	}
}
