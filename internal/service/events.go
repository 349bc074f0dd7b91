package service

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/store"
)

// DefaultEventPageSize is ListProviderEvents' page size when the request
// gives none.
const DefaultEventPageSize = 100

// DefaultEventPollInterval is how often an open watch looks for events that
// another replica appended.
const DefaultEventPollInterval = time.Second

// Byte budgets of the inbox's readers. Every read is bounded in bytes as
// well as in events, and the memory they can hold together is bounded;
// docs/security.md ("Memory budget of the inbox") gives the arithmetic.
const (
	// MaxEventPageBytes bounds a ListProviderEvents page (its encoded
	// events), so that a page fits a gRPC client's default 4 MiB receive
	// limit with room to spare. The first event always fits:
	// PAYMENTS_WEBHOOK_MAX_BYTES is at most a sixth of it, and an older
	// event over it is sent without its body.
	MaxEventPageBytes = 3 << 20
	// ListBytes bounds the bytes of List pages held at once, from the store
	// read until the answer is written (REST) or handed to gRPC: two full
	// pages. A List that waits ListWait for its turn is refused with
	// RESOURCE_EXHAUSTED.
	ListBytes = 2 * MaxEventPageBytes
	ListWait  = 10 * time.Second
	// watchBatchBytes bounds the events a watch reads from the store at
	// once (or the one event, if larger). A watch whose caller doesn't
	// read holds at most one event encoded for sending and one queued in
	// the transport, besides the rest of its batch.
	watchBatchBytes = 256 << 10
	// listWriteTimeout bounds writing a REST page, so a caller that stops
	// reading gives its share of ListBytes back.
	listWriteTimeout = 30 * time.Second
)

// EventsOptions configures NewEvents.
type EventsOptions struct {
	// Registerer holds the watch gauge; labels common to every series, such
	// as the environment, belong on it.
	Registerer prometheus.Registerer
	// Logger gets the store's failures, which callers see only as
	// UNAVAILABLE.
	Logger *slog.Logger
	// PollInterval is how often an open watch reads the store for events
	// committed by another process; 0 means DefaultEventPollInterval.
	PollInterval time.Duration
	// Readers are the only caller identities that may list or watch
	// events (PAYMENTS_EVENT_READERS, and the admins): events tell of
	// every caller's payments. Any other caller, and one without an
	// identity, is refused (PERMISSION_DENIED, CALLER_NOT_EVENT_READER),
	// unless EveryoneReads.
	Readers []Identity
	// EveryoneReads lets every caller read events, identity or not: for
	// --simulate only.
	EveryoneReads bool
}

// ReasonCallerNotEventReader is the ErrorInfo reason of PERMISSION_DENIED
// for a caller that may not read provider events.
const ReasonCallerNotEventReader = "CALLER_NOT_EVENT_READER"

// Events implements paymentsv1.ProviderEventsServiceServer: it reads the
// webhook inbox that package inbox writes.
type Events struct {
	paymentsv1.UnimplementedProviderEventsServiceServer
	store   *store.Store
	env     paymentsv1.Environment
	readers identitySet
	anyone  bool // every caller reads: --simulate
	poll    time.Duration
	logger  *slog.Logger
	watches prometheus.Gauge
	// pages holds ListBytes: the bytes of List pages held now.
	pages *semaphore.Weighted

	mu      sync.Mutex
	wake    chan struct{} // closed and replaced on each Appended
	closing chan struct{}
	once    sync.Once
}

// NewEvents returns the inbox reader for the events in st, which the
// provider environment env delivered.
func NewEvents(st *store.Store, env paymentsv1.Environment, opts EventsOptions) (*Events, error) {
	e := &Events{
		store:   st,
		env:     env,
		readers: newIdentitySet(opts.Readers),
		anyone:  opts.EveryoneReads,
		poll:    opts.PollInterval,
		logger:  opts.Logger,
		wake:    make(chan struct{}),
		closing: make(chan struct{}),
		pages:   semaphore.NewWeighted(ListBytes),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_provider_event_watches_open",
			Help: "WatchProviderEvents streams open now.",
		}),
	}
	if e.logger == nil {
		e.logger = slog.New(slog.DiscardHandler)
	}
	if e.poll <= 0 {
		e.poll = DefaultEventPollInterval
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(e.watches); err != nil {
			return nil, fmt.Errorf("register event metrics: %w", err)
		}
	}
	return e, nil
}

// Appended wakes the open watches: an event was committed in this process.
// Watches on other replicas find it by polling.
func (e *Events) Appended(store.Event) {
	e.mu.Lock()
	close(e.wake)
	e.wake = make(chan struct{})
	e.mu.Unlock()
}

// Close ends every open watch with UNAVAILABLE, and refuses new ones, so
// that a graceful stop does not wait on streams that never end by
// themselves. Callers resume elsewhere from the last sequence they got.
func (e *Events) Close() {
	e.once.Do(func() { close(e.closing) })
}

// mayRead refuses a caller that is not an event reader.
func (e *Events) mayRead(ctx context.Context) error {
	if e.anyone {
		return nil
	}
	c := identityOf(ctx)
	if c != nil && e.readers.has(c.id) {
		return nil
	}
	msg := "reading provider events needs a caller identity listed in PAYMENTS_EVENT_READERS (or PAYMENTS_ADMIN_CALLERS): events tell of every caller's payments"
	if c == nil || c.id.IsZero() {
		msg += "; this call came without a client certificate naming an identity (without mTLS events can't be read, except under --simulate)"
	}
	return withDetails(status.New(codes.PermissionDenied, msg),
		&errdetails.ErrorInfo{Reason: ReasonCallerNotEventReader, Domain: ErrorDomain, Metadata: map[string]string{"environment": envName(e.env)}})
}

func (e *Events) woken() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wake
}

// ListProviderEvents implements paymentsv1.ProviderEventsServiceServer. The
// request has been validated by the interceptor chain. A page stops at
// page_size events or MaxEventPageBytes, whichever comes first. Codes:
// UNAVAILABLE (503) when the inbox can't be read; RESOURCE_EXHAUSTED (429)
// when ListBytes stayed taken for ListWait.
func (e *Events) ListProviderEvents(ctx context.Context, req *paymentsv1.ListProviderEventsRequest) (*paymentsv1.ListProviderEventsResponse, error) {
	if err := e.mayRead(ctx); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = DefaultEventPageSize
	}
	// A page's size is known only once read: take a whole page's share,
	// and give back what the page doesn't need.
	held := int64(MaxEventPageBytes)
	wctx, cancel := context.WithTimeout(ctx, ListWait)
	err := e.pages.Acquire(wctx, held)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, refusal(e.env, codes.ResourceExhausted, "paymentsd is reading as many event pages as its memory allows: retry after a short delay", false, time.Second).Err()
	}
	release := func() { e.pages.Release(held) }
	events, err := e.store.ListEvents(ctx, store.EventQuery{
		After:        req.GetAfterSequence(),
		Limit:        size,
		MaxBytes:     MaxEventPageBytes,
		OmitBodyOver: MaxEventPageBytes,
	})
	if err != nil {
		release()
		return nil, e.readError(ctx, err)
	}
	resp := &paymentsv1.ListProviderEventsResponse{
		Events:            make([]*paymentsv1.ProviderEvent, 0, len(events)),
		NextAfterSequence: req.GetAfterSequence(),
	}
	var total int
	for _, ev := range events {
		pe := e.toProto(ev)
		// The store counts stored bytes; the page's bound is on what is
		// sent, which has each header twice (as text and as bytes).
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(pe))
		if len(resp.Events) > 0 && total+n > MaxEventPageBytes {
			break
		}
		total += n
		resp.Events = append(resp.Events, pe)
		resp.NextAfterSequence = ev.Sequence
	}
	if keep := min(held, int64(total)); keep < held {
		e.pages.Release(held - keep)
		held = keep
	}
	// Over REST the page is held until the gateway has written it.
	if !afterWrite(ctx, release) {
		defer release()
	}
	return resp, nil
}

// WatchProviderEvents implements paymentsv1.ProviderEventsServiceServer. It
// reads what is stored after the cursor, sends it, and waits for a wake-up
// from this process's intake or for the poll interval (events appended by
// another replica) before reading again. Sequences commit in order, so
// reading after the last sequence sent never skips one. It reads at most
// watchBatchBytes (or one event) at a time, and lets go of each event once
// encoded, so a caller that stops reading holds little. Codes: UNAVAILABLE
// when the inbox can't be read or paymentsd is shutting down (resume with
// the last sequence received); CANCELLED when the caller goes away.
func (e *Events) WatchProviderEvents(req *paymentsv1.WatchProviderEventsRequest, stream grpc.ServerStreamingServer[paymentsv1.WatchProviderEventsResponse]) error {
	ctx := stream.Context()
	if err := e.mayRead(ctx); err != nil {
		return err
	}
	e.watches.Inc()
	defer e.watches.Dec()
	ticker := time.NewTicker(e.poll)
	defer ticker.Stop()
	// Headers go out at once: a caller that has them knows the watch is
	// open, and will get every event committed from then on.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	after := req.GetAfterSequence()
	for {
		// Taken before the read, so an event committed during it still
		// wakes the next wait.
		wake := e.woken()
		select {
		case <-e.closing:
			return status.Error(codes.Unavailable, "paymentsd is shutting down; watch again, from after_sequence = the last sequence received")
		default:
		}
		events, err := e.store.ListEvents(ctx, store.EventQuery{
			After:        after,
			Limit:        DefaultEventPageSize,
			MaxBytes:     watchBatchBytes,
			OmitBodyOver: MaxEventPageBytes,
		})
		if err != nil {
			return e.readError(ctx, err)
		}
		for i := range events {
			// Encoded before Send, and the event let go, so that a Send
			// blocked by a caller that doesn't read holds the encoded
			// bytes only.
			var msg grpc.PreparedMsg
			if err := msg.Encode(stream, &paymentsv1.WatchProviderEventsResponse{Event: e.toProto(events[i])}); err != nil {
				e.logger.ErrorContext(ctx, "encode a webhook event", "sequence", events[i].Sequence, "error", err.Error())
				return status.Error(codes.Internal, "an event could not be encoded; watch again from after_sequence = the last sequence received")
			}
			seq := events[i].Sequence
			events[i] = store.Event{}
			if err := stream.SendMsg(&msg); err != nil {
				return err
			}
			after = seq
		}
		if len(events) > 0 {
			continue // a batch ends at its byte budget: more may be stored
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-e.closing:
			return status.Error(codes.Unavailable, "paymentsd is shutting down; watch again, from after_sequence = the last sequence received")
		case <-wake:
		case <-ticker.C:
		}
	}
}

// readError maps a failed read of the inbox to a status, logging the cause.
func (e *Events) readError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	e.logger.ErrorContext(ctx, "read the webhook inbox", "error", err.Error())
	return status.Error(codes.Unavailable, "the webhook inbox can't be read now; retry")
}

// toProto is ev as the API carries it. A sender may put any bytes in a
// header, and protobuf refuses a string that is not UTF-8 (gRPC would fail
// every read that reached the event, with INTERNAL): the string fields get
// text, and the bytes fields the exact bytes.
func (e *Events) toProto(ev store.Event) *paymentsv1.ProviderEvent {
	headers := make([]*paymentsv1.HttpHeader, len(ev.Headers))
	for i, h := range ev.Headers {
		headers[i] = &paymentsv1.HttpHeader{Name: utf8Text(h.Name), Value: utf8Text(h.Value), ValueBytes: []byte(h.Value)}
	}
	return &paymentsv1.ProviderEvent{
		Sequence:         ev.Sequence,
		ReceiveTime:      timestamppb.New(ev.ReceivedAt),
		ContentType:      utf8Text(ev.ContentType),
		ContentTypeBytes: []byte(ev.ContentType),
		Headers:          headers,
		Body:             ev.Body,
		BodyOmitted:      ev.BodyOmitted,
		BodySha256:       hex.EncodeToString(ev.BodySHA256[:]),
		DuplicateOf:      ev.DuplicateOf,
		// The provider documents no signature scheme: nothing can be
		// verified, whoever sent it.
		Verified:    false,
		Environment: e.env,
	}
}

// utf8Text is s with each run of bytes that is not valid UTF-8 replaced
// with U+FFFD.
func utf8Text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// afterWrite arranges for release to run once a REST call's answer is
// written, and reports whether ctx is one; a gRPC call's isn't.
func afterWrite(ctx context.Context, release func()) bool {
	c := restCallOf(ctx)
	if c != nil {
		c.afterWrite = append(c.afterWrite, release)
	}
	return c != nil
}
