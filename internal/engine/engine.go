// Package engine is paymentsd's payment engine: it takes a payment from a
// call, through its durable record and the provider, to what the caller is
// told, and settles what is left in doubt.
//
// Every decision is internal/record's: a call claims its key (record.Claim),
// sends only when the claim is Acquired, hands what it learnt to its
// process's outbox, which writes it (record.Outcome) however long the store
// takes, and answers its caller as record.Tell says: OK only once the 2xx is
// committed. Settlement re-sends what is in doubt (record.Settle). The
// engine speaks no gRPC: the transport turns an Answer into a status.
package engine

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// ErrHardStop is the cause of a call's context when paymentsd's drain
// deadline cut it off: its request, if any, is cut off too, and the caller
// hears what that means for the money.
var ErrHardStop = errors.New("paymentsd is shutting down")

// Describe says, in the transport's terms, how a call whose attempt ended
// as a says (once its outcome is written) is answered: the status code and
// message its record keeps (Record.Code, Record.LastError), which later
// calls answered from the record repeat.
type Describe func(a Answer) (code int32, msg string)

// Config configures New. Store, Client and Describe are required.
type Config struct {
	Store    *store.Store
	Client   *upstream.Client
	Describe Describe
	// Logger gets what the engine has to say; nil discards.
	Logger *slog.Logger
	// Metrics are the engine's metrics; nil registers them on a private
	// registry.
	Metrics *Metrics
	// LeaseTTL is how long a claim holds its key: it must outlast the
	// longest provider call. Default 30s.
	LeaseTTL time.Duration
	// SettlementWindow is how long after a key's fresh start paymentsd may
	// still send it. Default 10 minutes.
	SettlementWindow time.Duration
	// QuietPeriod is how long a request that ended without the provider's
	// answer is presumed still at the provider, from its start. Default 30s.
	QuietPeriod time.Duration
	// Retention and TombstoneRetention are how long records (and events)
	// and tombstones are kept; 0 keeps them. RetentionInterval is how often
	// Run deletes what they allow (default 10 minutes).
	Retention, TombstoneRetention, RetentionInterval time.Duration
	// SettleInterval is how often Run looks for records to settle, and the
	// first settlement backoff. Default 1s.
	SettleInterval time.Duration
	// MaxSends bounds the provider requests waited on at once, those whose
	// callers have gone included; past it a call sends nothing. Default
	// 1000.
	MaxSends int
	// Now is this process's wall clock, which Run measures against the
	// store's; nil means time.Now. Nothing is decided by it.
	Now func() time.Time
}

// Engine runs payments. It is safe for concurrent use.
type Engine struct {
	store    *store.Store
	client   *upstream.Client
	describe Describe
	logger   *slog.Logger
	metrics  *Metrics
	outbox   *outbox
	// sends bounds the provider requests waited on; sending counts them,
	// for Shutdown; cutOff ends when Shutdown cuts them off.
	sends       slots
	sending     sync.WaitGroup
	cutOff      context.Context
	cutOffSends context.CancelFunc
	// process names this process in leases: "<process>/<claim id>".
	process string

	leaseTTL, window, quiet                       time.Duration
	retention, tombstoneRetention, retentionEvery time.Duration
	settleEvery                                   time.Duration
	now                                           func() time.Time
	clockFar                                      bool
}

// New returns an Engine for cfg.
func New(cfg Config) *Engine {
	e := &Engine{
		store:              cfg.Store,
		client:             cfg.Client,
		describe:           cfg.Describe,
		logger:             cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		metrics:            cfg.Metrics,
		process:            newProcess(),
		leaseTTL:           cmp.Or(cfg.LeaseTTL, 30*time.Second),
		window:             cmp.Or(cfg.SettlementWindow, 10*time.Minute),
		quiet:              cmp.Or(cfg.QuietPeriod, 30*time.Second),
		retention:          cfg.Retention,
		tombstoneRetention: cfg.TombstoneRetention,
		retentionEvery:     cmp.Or(cfg.RetentionInterval, 10*time.Minute),
		settleEvery:        cmp.Or(cfg.SettleInterval, time.Second),
		now:                cfg.Now,
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.metrics == nil {
		e.metrics = NewMetrics(prometheus.NewRegistry(), cfg.Store)
	}
	e.outbox = newOutbox(e)
	e.sends.max = int64(cmp.Or(cfg.MaxSends, 1000))
	e.cutOff, e.cutOffSends = context.WithCancel(context.Background())
	return e
}

// Replica is this process's name in the records: its lease owners are
// "<replica>/<claim id>", and attempts name it.
func (e *Engine) Replica() string { return e.process }

// Metrics are the engine's metrics, which the transport's record store
// operations count too.
func (e *Engine) Metrics() *Metrics { return e.metrics }

// owner names a new claim of this process: "<process>/<12 hex digits>".
func (e *Engine) owner() string {
	var id [6]byte
	rand.Read(id[:])
	b := make([]byte, 0, len(e.process)+1+2*len(id))
	b = append(append(b, e.process...), '/')
	return string(hex.AppendEncode(b, id[:]))
}

// margin is how long before its lease ends a send must be over.
func (e *Engine) margin() time.Duration { return min(e.leaseTTL/5, 2*time.Second) }

// minSend is the least time left in a lease or window that is worth a
// send: the margin kept before its end, and as much again to send in.
func (e *Engine) minSend() time.Duration { return 2 * e.margin() }

func newProcess() string {
	var id [6]byte
	rand.Read(id[:])
	return "paymentsd-" + hex.EncodeToString(id[:])
}

// slots bounds the provider requests waited on at once.
type slots struct {
	mu     sync.Mutex
	n, max int64
}

func (s *slots) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n >= s.max {
		return false
	}
	s.n++
	return true
}

func (s *slots) release() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
}

// Shutdown waits for the provider requests paymentsd is still waiting on,
// whose callers may have gone, and for every outcome in the outbox to be
// recorded. If ctx ends first it cuts the requests off (each is recorded
// as possibly still at the provider), gives their outcomes a last moment,
// and stops the outbox: each outcome still not written is logged at error
// level. Its record stays in progress, and settlement sends the key again
// once its lease and quiet period have passed. Call it once nothing can
// start a call any more.
func (e *Engine) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		e.sending.Wait()
		close(done)
	}()
	select {
	case <-done:
		if e.outbox.idle(ctx) {
			e.outbox.stop()
			return
		}
	case <-ctx.Done():
	}
	e.cutOffSends()
	<-done
	last, cancel := context.WithTimeout(context.Background(), outboxLastChance)
	e.outbox.idle(last)
	cancel()
	e.outbox.stop()
}
