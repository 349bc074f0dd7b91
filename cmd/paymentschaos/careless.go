package main

import (
	"context"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// resolution is one resolution a person asked paymentsd for, and its
// answer.
type resolution struct {
	Key string `json:"key"`
	// NotCreated: the person said the provider has no payment (the
	// careless person always does); otherwise that it has one.
	NotCreated bool      `json:"not_created"`
	Start, End time.Time `json:"-"`
	// Accepted: paymentsd recorded it.
	Accepted bool `json:"accepted"`
	// Refusal is the code and reason of a refusal (or of a failed call).
	Refusal string `json:"refusal,omitempty"`
}

// carelessPerson is an on-call person who resolves every payment in doubt
// as NOT_CREATED without looking at the provider, the way the CLI does it
// ('paymentsd payments resolve KEY --outcome not-created --yes'): list the
// OUTCOME_UNKNOWN records, look each up, and resolve it with the update
// time seen, so that a record that changed meanwhile is refused
// (RECORD_CHANGED). paymentsd must refuse any resolution that contradicts
// what it told a caller (I4).
type carelessPerson struct {
	replicas []*replica
	interval time.Duration

	mu   sync.Mutex
	done []resolution
}

// run resolves, every interval, what is in doubt, until stop is closed or
// ctx ends.
func (p *carelessPerson) run(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-tick.C:
		}
		r := p.replicas[n%len(p.replicas)]
		if !r.running() {
			continue
		}
		for _, key := range p.inDoubt(ctx, r.admin) {
			select {
			case <-stop:
				return
			default:
			}
			p.resolve(ctx, r.admin, key)
		}
	}
}

// inDoubt lists the keys of OUTCOME_UNKNOWN records, or those it could
// list before a call failed.
func (p *carelessPerson) inDoubt(ctx context.Context, admin paymentsv1.PaymentsServiceClient) []string {
	var keys []string
	token := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		page, err := admin.ListMultiCardPayments(cctx, &paymentsv1.ListMultiCardPaymentsRequest{
			State:     []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN},
			PageSize:  1000,
			PageToken: token,
		})
		cancel()
		if err != nil {
			return keys
		}
		for _, s := range page.GetPayments() {
			keys = append(keys, s.GetIdempotencyKey())
		}
		if token = page.GetNextPageToken(); token == "" {
			return keys
		}
	}
}

// resolve looks key up and, if it is still in doubt, resolves it
// NOT_CREATED, as the CLI does.
func (p *carelessPerson) resolve(ctx context.Context, admin paymentsv1.PaymentsServiceClient, key string) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	current, err := admin.GetMultiCardPayment(cctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	if err != nil || current.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		return
	}
	res := resolution{Key: key, NotCreated: true, Start: time.Now()}
	_, err = admin.ResolveMultiCardPayment(cctx, &paymentsv1.ResolveMultiCardPaymentRequest{
		IdempotencyKey:     key,
		Outcome:            paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED,
		Evidence:           "paymentschaos: a careless person; nothing was checked on the provider's dashboard",
		ExpectedUpdateTime: current.GetUpdateTime(),
	})
	res.End = time.Now()
	if err == nil {
		res.Accepted = true
	} else {
		st := status.Convert(err)
		res.Refusal = st.Code().String()
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
				res.Refusal += " " + info.GetReason()
			}
		}
	}
	p.mu.Lock()
	p.done = append(p.done, res)
	p.mu.Unlock()
}

// resolutions returns the resolutions asked for so far.
func (p *carelessPerson) resolutions() []resolution {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]resolution(nil), p.done...)
}
