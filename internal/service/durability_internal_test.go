package service

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
	"example.com/paymentsd/internal/upstream"
)

// The tests here make the record store fail beneath the service, through
// the store's failure seam (storetest.Faults), at each write the issue of
// lost outcomes names: a call's outcome after a success, after a refusal,
// after an unknown outcome; sendNothing's record; a claim whose commit is
// lost; settlement's claim and its finish after a re-send; a resolution.

// Patterns of the store's statements, as the seam matches them (SQLite):
// a finish (record.WriteFinish), a new key's claim, an existing record's
// acquisition (a call's or settlement's), a resolution's audit entry.
const (
	finishSQL  = `outcomes = outcomes \+`
	claimSQL   = `INSERT INTO records`
	acquireSQL = `prior_state = `
	auditSQL   = `INSERT INTO audit_entries`
)

// held makes the fake provider hold the first request for a key until
// release is closed, telling arrived when it comes; later requests are
// answered at once, as the idempotent fake answers.
func held(p *simulator.Server) (arrived chan string, release chan struct{}) {
	arrived, release = make(chan string, 16), make(chan struct{})
	seen := map[string]bool{}
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		k := keyOf(r.Body)
		first := !seen[k]
		seen[k] = true
		arrived <- k
		if first {
			return simulator.Reply{Wait: release}
		}
		return simulator.Reply{}
	})
	return arrived, release
}

func waitFired(t *testing.T, f *storetest.Faults, kind string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case got := <-f.Fired():
			if got.Fault == kind {
				return
			}
		case <-timeout:
			t.Fatalf("no %q fault was applied", kind)
		}
	}
}

func (f fixture) record(t *testing.T, key string) record.Record {
	t.Helper()
	r, err := f.store.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s) error = %v", key, err)
	}
	return r
}

// TestSuccessOutlivesFailingCommits: the provider's 2xx arrives, and the
// store refuses to record it, for as long as the test likes. The caller is
// told OK only once it is committed: a caller whose deadline comes first
// hears PAYMENT_OUTCOME_UNKNOWN (told OK means durable). This process's
// settlement never takes the key over, however long ago its lease ended;
// a retry waits; once the store takes the write, the record says Succeeded
// with the provider's reply, a retry replays it, and the provider saw one
// request.
func TestSuccessOutlivesFailingCommits(t *testing.T) {
	t.Parallel()
	for _, deadline := range []time.Duration{0, 500 * time.Millisecond} {
		name := map[bool]string{true: "no deadline", false: "deadline first"}[deadline == 0]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
			f := newFixture(t, 10*time.Second, c.Now)
			arrived, release := held(f.p)
			type answer struct {
				resp *paymentsv1.CreateMultiCardPaymentResponse
				err  error
			}
			answered := make(chan answer, 1)
			go func() {
				ctx := context.Background()
				if deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, deadline)
					defer cancel()
				}
				resp, err := f.svc.CreateMultiCardPayment(ctx, payment("k"))
				answered <- answer{resp, err}
			}()
			<-arrived
			// Every commit of an outcome fails until the test clears it.
			f.faults.FailCommits(finishSQL, -1)
			close(release)
			waitFired(t, f.faults, "fail commit")

			var told answer
			if deadline > 0 {
				told = <-answered
				if reasonOf(told.err) != ReasonOutcomeUnknown {
					t.Fatalf("call whose deadline came first = %v (%s), want %s: its 2xx is not yet durable", told.err, reasonOf(told.err), ReasonOutcomeUnknown)
				}
			}
			if got := f.metric(t, "paymentsd_outcomes_pending"); got != 1 {
				t.Errorf("paymentsd_outcomes_pending = %v, want 1", got)
			}
			// Long past the lease and quiet period: settlement here never
			// takes over a key its own process holds.
			c.add(time.Hour)
			f.svc.engine.Settle(t.Context())
			if r := f.record(t, "k"); r.State != record.InProgress {
				t.Errorf("record with its outcome pending = %v, want InProgress", r.State)
			}
			// A retry here waits for the outcome.
			short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			_, err := f.svc.CreateMultiCardPayment(short, payment("k"))
			cancel()
			if reasonOf(err) != ReasonInProgress {
				t.Errorf("retry while the outcome is pending = %v (%s), want %s", err, reasonOf(err), ReasonInProgress)
			}
			if deadline == 0 {
				// Without a deadline, the success is answered only once
				// it is written.
				select {
				case a := <-answered:
					t.Fatalf("call answered (%v, %v) before its record was written", a.resp, a.err)
				default:
				}
			}

			f.faults.Clear()
			if deadline == 0 {
				told = <-answered
				if told.err != nil {
					t.Fatalf("call = %v, want OK with the provider's reply", told.err)
				}
			}
			f.svc.engine.Await(t.Context(), "k")
			r := f.record(t, "k")
			if r.State != record.Succeeded || (told.resp != nil && string(r.Reply) != string(told.resp.GetPaymentJson())) {
				t.Errorf("record = %v %s, want Succeeded with the reply the caller was told (%s)", r.State, r.Reply, told.resp.GetPaymentJson())
			}
			got, err := f.svc.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if h := got.GetAttemptHistory(); len(h) != 1 || h[0].GetProviderHttpStatus() != 200 || string(h[0].GetPaymentJson()) != string(r.Reply) ||
				h[0].GetKind() != paymentsv1.AttemptKind_ATTEMPT_KIND_CALL || h[0].GetReplica() != f.svc.Replica() {
				t.Errorf("attempt history = %v, want the call's 200 with the reply, by this replica", h)
			}
			replay, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k"))
			if err != nil || !replay.GetReplayed() || string(replay.GetPaymentJson()) != string(r.Reply) {
				t.Errorf("retry after the record = %v, %v; want a replay of the recorded payment", replay, err)
			}
			if n := len(f.p.Requests()); n != 1 {
				t.Errorf("provider saw %d requests, want 1", n)
			}
			if f.logs.count("could not record a payment's outcome; retrying until the record store takes it (the key is held meanwhile: no replica sends it)") != 1 ||
				f.logs.count("recorded a payment's outcome after the record store failed") != 1 {
				t.Errorf("logs: want the first failure and the landing once each")
			}
		})
	}
}

// TestSuccessWhoseCommitIsLost: the commit of a success is sent and its
// answer lost (the store reports ErrCommitUnknown, and it was written).
// The outbox's retry finds it written and writes nothing more; the caller
// is told OK with the reply, which the record holds, once.
func TestSuccessWhoseCommitIsLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	f.faults.LoseCommits(finishSQL, 1)
	resp, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k"))
	if err != nil {
		t.Fatalf("call = %v, want OK", err)
	}
	waitFired(t, f.faults, "lose commit")
	r := f.record(t, "k")
	as, err := f.store.Attempts(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != record.Succeeded || string(r.Reply) != string(resp.GetPaymentJson()) || r.Requests != 1 || len(as) != 1 {
		t.Errorf("record = %v %s, %d attempts, %d attempt rows; want Succeeded with the reply the caller was told, once", r.State, r.Reply, r.Requests, len(as))
	}
}

// TestUnknownOutcomeAnsweredAtOnce: an outcome nobody knows is answered at
// once, whatever the store does, and its record is written once the store
// takes it; settlement then re-sends the key, as it exists to.
func TestUnknownOutcomeAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	f.p.SetScript(simulator.Sequence(simulator.Reply{Status: http.StatusServiceUnavailable}))
	f.faults.FailCommits(finishSQL, -1)
	_, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k"))
	if reasonOf(err) != ReasonOutcomeUnknown {
		t.Fatalf("call = %v (%s), want %s", err, reasonOf(err), ReasonOutcomeUnknown)
	}
	f.faults.Clear()
	f.svc.engine.Await(t.Context(), "k")
	if r := f.record(t, "k"); r.State != record.OutcomeUnknown {
		t.Errorf("record = %v, want OutcomeUnknown", r.State)
	}
	c.add(time.Minute) // past its quiet period and first settlement time
	f.svc.engine.Settle(t.Context())
	if r := f.record(t, "k"); r.State != record.Succeeded {
		t.Errorf("record after settlement = %v, want Succeeded", r.State)
	}
}

// TestNotCreatedOnlyOnceRecorded: a refusal that proves no payment exists
// is answered PAYMENT_NOT_CREATED only once its record says so: a failed
// commit is retried and then it is; a record still unwritten when the
// caller's deadline comes is PAYMENT_OUTCOME_UNKNOWN, and the record is
// written later.
func TestNotCreatedOnlyOnceRecorded(t *testing.T) {
	t.Parallel()
	refuse := simulator.Always(simulator.Reply{Status: http.StatusBadRequest, Body: []byte(`{"error":"bad"}`)})
	t.Run("retried", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, 10*time.Second, nil)
		f.p.SetScript(refuse)
		f.faults.FailCommits(finishSQL, 2)
		_, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k"))
		if status.Code(err) != codes.InvalidArgument || reasonOf(err) != ReasonNotCreated {
			t.Errorf("call = %v (%s), want INVALID_ARGUMENT %s", err, reasonOf(err), ReasonNotCreated)
		}
		if r := f.record(t, "k"); r.State != record.NotCreated {
			t.Errorf("record = %v, want NotCreated", r.State)
		}
	})
	t.Run("deadline first", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, 10*time.Second, nil)
		f.p.SetScript(refuse)
		f.faults.FailStatements(finishSQL, -1)
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := f.svc.CreateMultiCardPayment(ctx, payment("k"))
		if reasonOf(err) != ReasonOutcomeUnknown {
			t.Errorf("call = %v (%s), want %s", err, reasonOf(err), ReasonOutcomeUnknown)
		}
		f.faults.Clear()
		f.svc.engine.Await(t.Context(), "k")
		if r := f.record(t, "k"); r.State != record.NotCreated {
			t.Errorf("record = %v, want NotCreated", r.State)
		}
	})
}

// TestSendNothingRecordFails: a call that acquired its record and sends
// nothing (here, paymentsd already waits on as many provider requests as
// it may) records NotCreated through the outbox; it says
// PAYMENT_NOT_CREATED only once that is written.
func TestSendNothingRecordFails(t *testing.T) {
	t.Parallel()
	for _, failing := range []int{2, -1} {
		name := map[bool]string{true: "retried", false: "deadline first"}[failing > 0]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureWith(t, 10*time.Second, nil, 1)
			arrived, release := held(f.p)
			defer close(release)
			go f.svc.CreateMultiCardPayment(context.Background(), payment("holds-the-slot"))
			<-arrived
			f.faults.FailCommits(finishSQL, failing)
			// A deadline only where it must come first: a busy machine
			// may take longer than any to write twice.
			ctx, cancel := t.Context(), context.CancelFunc(func() {})
			if failing < 0 {
				ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond)
			}
			defer cancel()
			_, err := f.svc.CreateMultiCardPayment(ctx, payment("k"))
			want := map[bool]string{true: ReasonNotCreated, false: ReasonOutcomeUnknown}[failing > 0]
			if status.Code(err) != codes.ResourceExhausted || reasonOf(err) != want {
				t.Errorf("call = %v (%s), want RESOURCE_EXHAUSTED %s", err, reasonOf(err), want)
			}
			f.faults.Clear()
			f.svc.engine.Await(t.Context(), "k")
			if r := f.record(t, "k"); r.State != record.NotCreated {
				t.Errorf("record = %v, want NotCreated", r.State)
			}
			if n := f.p.KeyStats("k").Requests; n != 0 {
				t.Errorf("provider saw %d requests for k, want none", n)
			}
		})
	}
}

// TestClaimCommittedDespiteError: the commit of a call's claim is lost (it
// was written, and the store reports ErrCommitUnknown). The call sent
// nothing and says so, and the outbox releases the claim: one that started
// the key afresh leaves the record NotCreated (nothing was sent, and
// settlement never sends it); one that took over a record whose earlier
// attempt may have created the payment leaves it unknown, for settlement.
// No re-read and no guess: the call tells what it read.
func TestClaimCommittedDespiteError(t *testing.T) {
	t.Parallel()
	t.Run("fresh key", func(t *testing.T) {
		t.Parallel()
		c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
		f := newFixture(t, 10*time.Second, c.Now)
		f.faults.LoseCommits(claimSQL, 1)
		_, err := f.svc.CreateMultiCardPayment(t.Context(), payment("fresh"))
		if reasonOf(err) != ReasonNotSent {
			t.Errorf("answer = %v (%s), want %s", err, reasonOf(err), ReasonNotSent)
		}
		f.svc.engine.Await(t.Context(), "fresh")
		if r := f.record(t, "fresh"); r.State != record.NotCreated || r.LeaseOwner != "" {
			t.Errorf("record = %v held by %q, want NotCreated, released", r.State, r.LeaseOwner)
		}
		c.add(time.Hour)
		f.svc.engine.Settle(t.Context())
		if n := len(f.p.Requests()); n != 0 {
			t.Errorf("settlement sent %d requests for a key whose claim sent nothing", n)
		}
	})
	t.Run("after a holder died", func(t *testing.T) {
		t.Parallel()
		c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
		f := newFixture(t, 10*time.Second, c.Now)
		// Another replica claims the key and sends it, and the provider
		// creates the payment; that replica dies before recording
		// anything.
		dead := claimFor("orphan", "paymentsd-another/dead")
		if _, err := f.store.Begin(t.Context(), dead, nil); err != nil {
			t.Fatal(err)
		}
		f.send(t, dead.Body)
		// Past its lease and quiet period a retry takes the record over,
		// and the commit of its claim is lost.
		c.add(dead.LeaseTTL + dead.Quiet + time.Second)
		f.faults.LoseCommits(acquireSQL, 1)
		_, err := f.svc.CreateMultiCardPayment(t.Context(), payment("orphan"))
		if reasonOf(err) != ReasonOutcomeUnknown {
			t.Errorf("answer = %v (%s), want %s", err, reasonOf(err), ReasonOutcomeUnknown)
		}
		f.svc.engine.Await(t.Context(), "orphan")
		if r := f.record(t, "orphan"); r.State != record.OutcomeUnknown || r.LeaseOwner != "" {
			t.Errorf("record = %v held by %q, want OutcomeUnknown, released", r.State, r.LeaseOwner)
		}
		c.add(time.Minute)
		f.svc.engine.Settle(t.Context())
		if r := f.record(t, "orphan"); r.State != record.Succeeded {
			t.Errorf("record after settlement = %v, want Succeeded", r.State)
		}
	})
}

// send sends body to the fixture's provider as a replica would.
func (f fixture) send(t *testing.T, body []byte) {
	t.Helper()
	client, err := upstream.New(upstream.Config{BaseURL: f.p.URL, APIKey: internalKey, HTTPClient: &http.Client{},
		MaxRequests: 1, Timeout: 5 * time.Second, Metrics: upstream.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Send(t.Context(), body); err != nil {
		t.Fatal(err)
	}
}

// TestSettlementClaimFaults: settlement's claim fails (nothing claimed:
// the next round sends the key) or its commit is lost (the record may be
// held by a claim of this process's, which no replica of it would ever
// take over: it is released, and the next round sends the key).
func TestSettlementClaimFaults(t *testing.T) {
	t.Parallel()
	for _, lose := range []bool{false, true} {
		t.Run(map[bool]string{false: "failed", true: "lost"}[lose], func(t *testing.T) {
			t.Parallel()
			c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
			f := newFixture(t, 10*time.Second, c.Now)
			f.makeUnknown(t, "k")
			f.p.SetScript(nil)
			c.add(time.Minute)
			sent := len(f.p.Requests())
			if lose {
				f.faults.LoseCommits(acquireSQL, 1)
			} else {
				f.faults.FailCommits(acquireSQL, 1)
			}
			f.svc.engine.Settle(t.Context())
			if n := len(f.p.Requests()) - sent; n != 0 {
				t.Errorf("settlement whose claim failed sent %d requests, want none", n)
			}
			if lose {
				waitState(t, f, "k", record.OutcomeUnknown)
			}
			c.add(time.Minute)
			f.svc.engine.Settle(t.Context())
			if r := f.record(t, "k"); r.State != record.Succeeded {
				t.Errorf("record after the next round = %v, want Succeeded", r.State)
			}
		})
	}
}

// waitState waits for key's record to reach state (written by the outbox).
func waitState(t *testing.T, f fixture, key string, state record.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// A claim released a moment ago may not have committed yet: its
		// key has no record until it does.
		r, err := f.store.Get(t.Context(), key)
		switch {
		case err == nil && r.State == state:
			return
		case err != nil && !errors.Is(err, store.ErrNotFound):
			t.Fatalf("Get(%s) error = %v", key, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s = %v (error %v), never %v", key, r.State, err, state)
		}
		time.Sleep(5 * time.Millisecond) // the outbox has no signal but the record
	}
}

// TestSettlementFinishFails: settlement's re-send gets a 2xx and the store
// refuses to record it for a while: the outbox writes it once it can, and
// nobody sends the key again meanwhile.
func TestSettlementFinishFails(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	f.makeUnknown(t, "k")
	f.p.SetScript(nil)
	c.add(time.Minute)
	f.faults.FailCommits(finishSQL, 5)
	f.svc.engine.Settle(t.Context())
	f.svc.engine.Await(t.Context(), "k")
	c.add(time.Minute)
	f.svc.engine.Settle(t.Context())
	if r := f.record(t, "k"); r.State != record.Succeeded || r.SettleAttempts != 1 {
		t.Errorf("record = %v after %d settlement attempts, want Succeeded after 1", r.State, r.SettleAttempts)
	}
	if n := len(f.p.Requests()); n != 2 {
		t.Errorf("provider saw %d requests, want 2 (the call's and one re-send)", n)
	}
}

// TestResolveCommitFaults: a resolution whose commit fails or is lost is
// RESOLUTION_OUTCOME_UNKNOWN: the person must look the key up (it may or
// may not be written).
func TestResolveCommitFaults(t *testing.T) {
	t.Parallel()
	for _, lose := range []bool{false, true} {
		t.Run(map[bool]string{false: "failed", true: "lost"}[lose], func(t *testing.T) {
			t.Parallel()
			c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
			f := newFixture(t, 10*time.Second, c.Now)
			f.svc.everyoneAdmin = true
			f.makeUnknown(t, "k")
			c.add(time.Hour)
			if lose {
				f.faults.LoseCommits(auditSQL, 1)
			} else {
				f.faults.FailCommits(auditSQL, 1)
			}
			_, err := f.svc.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k",
				Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "dashboard: none"})
			if status.Code(err) != codes.Unavailable || reasonOf(err) != ReasonResolutionOutcomeUnknown {
				t.Errorf("resolve = %v (%s), want UNAVAILABLE %s", err, reasonOf(err), ReasonResolutionOutcomeUnknown)
			}
			want := map[bool]record.State{false: record.OutcomeUnknown, true: record.NotCreated}[lose]
			if r := f.record(t, "k"); r.State != want {
				t.Errorf("record = %v, want %v", r.State, want)
			}
		})
	}
}

// TestResolveRefusals: a reply that names another payment is refused, and
// nothing is written. (NOT_CREATED for a key an attempt of which got a 2xx
// can't come up: a 2xx makes the record Succeeded, which is final, and
// only an unknown record can be resolved.)
func TestResolveRefusals(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	f.svc.everyoneAdmin = true
	f.makeUnknown(t, "k")
	c.add(time.Hour)
	before, err := f.svc.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(outcome paymentsv1.ResolutionOutcome, reply string) error {
		_, err := f.svc.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k",
			Outcome: outcome, Evidence: "dashboard", ReplyJson: reply})
		return err
	}
	for _, tc := range []struct{ reply, field string }{
		{`{"id":"pay_other","idempotencyKey":"someone-else","amountMoney":{"amount":999999,"currency":"EUR"}}`, "reply_json.idempotencyKey"},
		{`{"idempotencyKey":"k","amountMoney":{"amount":999999,"currency":"USD"}}`, "reply_json.amountMoney.amount"},
		{`{"amountMoney":{"amount":1250,"currency":"EUR"}}`, "reply_json.amountMoney.currency"},
		{`{"amountMoney":{"amount":"1250","currency":"USD"}}`, "reply_json.amountMoney.amount"},
		{`{"idempotencyKey":"k","idempotencyKey":"other"}`, "reply_json.idempotencyKey"},
	} {
		err := resolve(paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, tc.reply)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || violatedField(st) != tc.field {
			t.Errorf("resolve with %s = %v (field %q), want INVALID_ARGUMENT naming %s", tc.reply, err, violatedField(st), tc.field)
		}
	}
	after, err := f.svc.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after, protocmp.Transform()); diff != "" {
		t.Errorf("refused resolutions changed the record (-before +after):\n%s", diff)
	}
	if err := resolve(paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED,
		`{"id":"p","idempotencyKey":"k","amountMoney":{"amount":1.25e3,"currency":"USD"}}`); err != nil {
		t.Errorf("resolve with this payment's reply = %v, want OK", err)
	}
}

func violatedField(st *status.Status) string {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestShutdownLogsWhatIsPending: at its deadline Shutdown stops the
// outbox, and logs each outcome still not written.
func TestShutdownLogsWhatIsPending(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	f.faults.FailStatements(finishSQL, -1)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := f.svc.CreateMultiCardPayment(ctx, payment("k")); reasonOf(err) != ReasonOutcomeUnknown {
		t.Fatalf("call = %v (%s), want %s when its deadline came with its 2xx not committed", err, reasonOf(err), ReasonOutcomeUnknown)
	}
	stop, cancelStop := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancelStop()
	f.svc.Shutdown(stop)
	if n := f.logs.count("paymentsd stopped with a payment's outcome not recorded: the record stays in progress, and settlement sends the key again once its lease and quiet period have passed"); n != 1 {
		t.Errorf("logged %d lines for the pending outcome at shutdown, want 1", n)
	}
	if r := f.record(t, "k"); r.State != record.InProgress {
		t.Errorf("record = %v, want InProgress (for settlement)", r.State)
	}
}

// TestClaimStuckAnsweredByDeadline: the transaction that holds a call's
// claim stops answering (a primary gone while a pooler queues its
// statements), and the caller gives up. The call is answered at once, with
// what it knows (its claim may commit yet; it sent nothing), not once the
// transaction goes through; and once it does, the claim's continuation
// releases it (nothing was sent: the fresh key is NotCreated) rather than
// leaving it held by nobody. The caller gives up by cancelling once its
// claim's statement is stuck, so that a busy machine can't make the claim
// run only after a deadline (it would then write nothing:
// TestBeginQueuedPastDeadline in store).
func TestClaimStuckAnsweredByDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	release := f.faults.HangStatements(claimSQL)
	defer release()
	ctx := cancelWhenHung(t, f)
	answered := make(chan error, 1)
	go func() {
		_, err := f.svc.CreateMultiCardPayment(ctx, payment("stuck"))
		answered <- err
	}()
	var err error
	select {
	case err = <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("the call was not answered while its claim's transaction was stuck")
	}
	if r := reasonOf(err); r != ReasonOutcomeUnknown && r != ReasonNotSent {
		t.Errorf("call = %v (%s), want %s or %s", err, r, ReasonOutcomeUnknown, ReasonNotSent)
	}
	release()
	// The claim commits, and its continuation releases it.
	waitState(t, f, "stuck", record.NotCreated)
	if n := len(f.p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests, want none", n)
	}
}

// cancelWhenHung is a context cancelled once a statement the fixture's
// faults hang is stuck.
func cancelWhenHung(t *testing.T, f fixture) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() {
		for {
			select {
			case got := <-f.faults.Fired():
				if got.Fault == "hang statement" {
					cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx
}

// TestClaimStuckOverUnknownRecordReleased: a call's claim would take over a
// record an earlier call left unknown, and its transaction is stuck when
// the caller gives up. The claim has run and may commit, and an earlier
// attempt may have created the payment, so the call answers
// PAYMENT_OUTCOME_UNKNOWN; once the claim commits, its continuation
// releases it for settlement, as TestClaimStuckAnsweredByDeadline's does,
// rather than leaving the key InProgress (every retry answered
// PAYMENT_IN_PROGRESS) until its lease runs out.
func TestClaimStuckOverUnknownRecordReleased(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	f.p.SetScript(simulator.Sequence(simulator.Reply{Status: http.StatusServiceUnavailable}))
	f.faults.FailCommits(finishSQL, -1)
	if _, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k")); reasonOf(err) != ReasonOutcomeUnknown {
		t.Fatalf("first call = %v (%s), want %s", err, reasonOf(err), ReasonOutcomeUnknown)
	}
	f.faults.Clear()
	f.svc.engine.Await(t.Context(), "k")
	before := f.record(t, "k")
	if before.State != record.OutcomeUnknown {
		t.Fatalf("record = %v, want OutcomeUnknown", before.State)
	}
	c.add(time.Minute) // past its quiet period: a retry takes it over
	release := f.faults.HangStatements(acquireSQL)
	defer release()
	_, err := f.svc.CreateMultiCardPayment(cancelWhenHung(t, f), payment("k"))
	if r := reasonOf(err); r != ReasonOutcomeUnknown {
		t.Errorf("retry = %v (%s), want %s", err, r, ReasonOutcomeUnknown)
	}
	release()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r, err := f.store.Get(t.Context(), "k")
		if err == nil && r.UpdatedAt.After(before.UpdatedAt) && r.State == record.OutcomeUnknown && r.LeaseOwner == "" {
			if r.AttemptSeq != before.AttemptSeq {
				t.Errorf("record's attempt = %d, want %d: a claim that sent nothing is no attempt", r.AttemptSeq, before.AttemptSeq)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record = %v (updated %v, was %v) held by %q, %v; the stuck claim was never released", r.State, r.UpdatedAt, before.UpdatedAt, r.LeaseOwner, err)
		}
	}
	if n := len(f.p.Requests()); n != 1 {
		t.Errorf("provider saw %d requests, want the first call's only", n)
	}
}
