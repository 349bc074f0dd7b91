package service

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"example.com/paymentsd/internal/record"
)

// TestNoDeadlineCallerGoesAwayMidSend: a caller that set no deadline (its
// request is made on the caller's own goroutine) goes away while its
// request is at the provider, and the provider then pays. The caller is
// told the request is still at the provider (never that nothing was
// created); the outcome is recorded all the same, also when the store
// refuses it at first; a retry with the key replays the reply; the
// provider saw one request.
func TestNoDeadlineCallerGoesAwayMidSend(t *testing.T) {
	t.Parallel()
	for _, failing := range []bool{false, true} {
		name := map[bool]string{false: "store takes the outcome", true: "store refuses the outcome at first"}[failing]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 10*time.Second, nil)
			arrived, release := held(f.p)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			answered := make(chan error, 1)
			go func() {
				_, err := f.svc.CreateMultiCardPayment(ctx, payment("k"))
				answered <- err
			}()
			<-arrived
			cancel()
			if failing {
				f.faults.FailCommits(finishSQL, -1)
			}
			close(release)
			if failing {
				waitFired(t, f.faults, "fail commit")
			}
			err := <-answered
			if st := status.Convert(err); st.Code() != codes.Canceled || reasonOf(err) != ReasonInProgress {
				t.Errorf("call whose caller went away = %v, reason %q; want Canceled, %s", st.Code(), reasonOf(err), ReasonInProgress)
			}
			if failing {
				f.faults.Clear()
			}
			waitState(t, f, "k", record.Succeeded)
			rec := f.record(t, "k")
			resp, err := f.svc.CreateMultiCardPayment(t.Context(), payment("k"))
			if err != nil {
				t.Fatalf("retry after the outcome was recorded = %v, want the replay", err)
			}
			if !resp.GetReplayed() || string(resp.GetPaymentJson()) != string(rec.Reply) || len(rec.Reply) == 0 {
				t.Errorf("retry = replayed %v, payment %s; want the recorded reply %s, replayed", resp.GetReplayed(), resp.GetPaymentJson(), rec.Reply)
			}
			if n := len(f.p.Requests()); n != 1 {
				t.Errorf("provider saw %d requests, want 1", n)
			}
		})
	}
}
