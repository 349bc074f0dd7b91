package main

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// readRecord looks key up on a replica, as an admin (who may read any
// caller's record).
func readRecord(ctx context.Context, client paymentsv1.PaymentsServiceClient, key string) record {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := client.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	switch {
	case status.Code(err) == codes.NotFound:
		return record{}
	case err != nil:
		return record{Err: status.Convert(err).Code().String() + ": " + status.Convert(err).Message()}
	}
	rec := record{Found: true, State: got.GetState(), Reply: got.GetPaymentJson(), GaveUp: got.GetSettlementGaveUp()}
	for _, a := range got.GetAttemptHistory() {
		if s := a.GetProviderHttpStatus(); s >= 200 && s < 300 {
			rec.Read2xx = append(rec.Read2xx, a.GetStartTime().AsTime())
		}
	}
	for _, a := range got.GetAuditEntries() {
		rec.Resolutions = append(rec.Resolutions, recordedResolution{
			At:         a.GetCreateTime().AsTime(),
			NotCreated: a.GetOutcome() == paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED,
		})
	}
	return rec
}

// due reports whether settlement (or a lookup that failed) still owes a
// record an outcome.
func due(r record) bool {
	return r.Err != "" || r.Found && (r.State == paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS ||
		r.State == paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN && !r.GaveUp)
}

// awaitSettlement reads every key's record until none is due, or timeout
// has passed, and returns the last records read, and how many were due
// when it began.
func awaitSettlement(ctx context.Context, client paymentsv1.PaymentsServiceClient, keys []string, timeout time.Duration, progress func(due int)) (map[string]record, int) {
	records := make(map[string]record, len(keys))
	var mu sync.Mutex
	pending := keys
	deadline := time.Now().Add(timeout)
	dueAtFirst := -1
	for {
		var wg sync.WaitGroup
		work := make(chan string)
		for range 8 {
			wg.Go(func() {
				for k := range work {
					r := readRecord(ctx, client, k)
					mu.Lock()
					records[k] = r
					mu.Unlock()
				}
			})
		}
		for _, k := range pending {
			work <- k
		}
		close(work)
		wg.Wait()
		var still []string
		for _, k := range pending {
			if due(records[k]) {
				still = append(still, k)
			}
		}
		if dueAtFirst < 0 {
			dueAtFirst = len(still)
		}
		pending = still
		progress(len(pending))
		if len(pending) == 0 || time.Now().After(deadline) || !sleepCtx(ctx, time.Second) {
			return records, dueAtFirst
		}
	}
}
