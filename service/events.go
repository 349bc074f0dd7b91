package service

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/store"
)

// DefaultEventPageSize is ListProviderEvents' page size when the request
// gives none.
const DefaultEventPageSize = 100

// DefaultEventPollInterval is how often an open watch looks for events that
// another replica appended.
const DefaultEventPollInterval = time.Second

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
}

// Events implements paymentsv1.ProviderEventsServiceServer: it reads the
// webhook inbox that package inbox writes.
type Events struct {
	paymentsv1.UnimplementedProviderEventsServiceServer
	store   *store.Store
	env     paymentsv1.Environment
	poll    time.Duration
	logger  *slog.Logger
	watches prometheus.Gauge

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
		poll:    opts.PollInterval,
		logger:  opts.Logger,
		wake:    make(chan struct{}),
		closing: make(chan struct{}),
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

func (e *Events) woken() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wake
}

// ListProviderEvents implements paymentsv1.ProviderEventsServiceServer. The
// request has been validated by the interceptor chain. Codes: UNAVAILABLE
// (503) when the inbox can't be read.
func (e *Events) ListProviderEvents(ctx context.Context, req *paymentsv1.ListProviderEventsRequest) (*paymentsv1.ListProviderEventsResponse, error) {
	size := int(req.GetPageSize())
	if size == 0 {
		size = DefaultEventPageSize
	}
	events, err := e.store.ListEvents(ctx, store.EventQuery{After: req.GetAfterSequence(), Limit: size})
	if err != nil {
		return nil, e.readError(ctx, err)
	}
	resp := &paymentsv1.ListProviderEventsResponse{
		Events:            make([]*paymentsv1.ProviderEvent, 0, len(events)),
		NextAfterSequence: req.GetAfterSequence(),
	}
	for _, ev := range events {
		resp.Events = append(resp.Events, e.toProto(ev))
		resp.NextAfterSequence = ev.Sequence
	}
	return resp, nil
}

// WatchProviderEvents implements paymentsv1.ProviderEventsServiceServer. It
// reads what is stored after the cursor, sends it, and waits for a wake-up
// from this process's intake or for the poll interval (events appended by
// another replica) before reading again. Sequences commit in order, so
// reading after the last sequence sent never skips one. Codes: UNAVAILABLE
// when the inbox can't be read or paymentsd is shutting down (resume with
// the last sequence received); CANCELLED when the caller goes away.
func (e *Events) WatchProviderEvents(req *paymentsv1.WatchProviderEventsRequest, stream grpc.ServerStreamingServer[paymentsv1.WatchProviderEventsResponse]) error {
	ctx := stream.Context()
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
		events, err := e.store.ListEvents(ctx, store.EventQuery{After: after, Limit: DefaultEventPageSize})
		if err != nil {
			return e.readError(ctx, err)
		}
		for _, ev := range events {
			if err := stream.Send(&paymentsv1.WatchProviderEventsResponse{Event: e.toProto(ev)}); err != nil {
				return err
			}
			after = ev.Sequence
		}
		if len(events) == DefaultEventPageSize {
			continue // more may be stored already
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

func (e *Events) toProto(ev store.Event) *paymentsv1.ProviderEvent {
	headers := make([]*paymentsv1.HttpHeader, len(ev.Headers))
	for i, h := range ev.Headers {
		headers[i] = &paymentsv1.HttpHeader{Name: h.Name, Value: h.Value}
	}
	return &paymentsv1.ProviderEvent{
		Sequence:    ev.Sequence,
		ReceiveTime: timestamppb.New(ev.ReceivedAt),
		ContentType: ev.ContentType,
		Headers:     headers,
		Body:        ev.Body,
		BodySha256:  hex.EncodeToString(ev.BodySHA256[:]),
		DuplicateOf: ev.DuplicateOf,
		// The provider documents no signature scheme: nothing can be
		// verified, whoever sent it.
		Verified:    false,
		Environment: e.env,
	}
}
