package store

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
)

// TestWritesCoverStep: every column record.Step changes is one its write's
// statement sets, over records in every state and every kind of event:
// a statement that left one out would lose what Step decided.
func TestWritesCoverStep(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	body := []byte(`{}`)
	sum := sha256.Sum256(body)
	base := record.Record{Key: "k", Body: body, BodySHA256: sum, Currency: "EUR", Amount: 1, Requests: 2,
		ProviderStatus: 503, Reply: []byte(`{"e":1}`), LastError: "503", Code: 14, RequestID: "r", Caller: "c",
		CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Minute), SettleBy: now.Add(time.Hour),
		AttemptSeq: 2, AttemptKind: record.ByCall, AttemptRequestID: "r", AttemptStartedAt: now.Add(-time.Hour)}
	var recs []*record.Record
	recs = append(recs, nil)
	for _, st := range []record.State{record.InProgress, record.Succeeded, record.NotCreated, record.OutcomeUnknown} {
		for _, lease := range []time.Duration{-time.Second, time.Second} {
			for _, window := range []time.Duration{-time.Second, time.Hour} {
				for _, prior := range []record.State{0, record.NotCreated, record.OutcomeUnknown} {
					for _, flags := range []int{0, 1, 2, 3} {
						r := base
						r.State, r.PriorState = st, prior
						r.SettleBy = now.Add(window)
						r.GaveUp = flags&1 != 0
						if flags&2 != 0 {
							r.ResolvedAt = now.Add(-time.Second)
							r.QuietUntil = now.Add(time.Second)
						}
						if st == record.InProgress {
							r.LeaseOwner, r.LeaseExpiresAt = "p/1", now.Add(lease)
						}
						if st == record.OutcomeUnknown {
							r.NextSettleAt = now.Add(lease)
						}
						recs = append(recs, &r)
					}
				}
			}
		}
	}
	abandoned := record.Attempt{Number: 2, Owner: "p/1", Abandoned: true, State: record.OutcomeUnknown}
	ended := record.Attempt{Number: 2, Owner: "p/1", State: record.OutcomeUnknown}
	var events []record.Event
	for _, owner := range []string{"p/2", "q/1"} {
		for _, settled := range []bool{false, true} {
			c := record.Claim{Request: record.Request{Key: "k", Body: body, BodySHA256: sum}, Owner: owner,
				LeaseTTL: time.Minute, Window: time.Hour, Quiet: time.Second, Settled: settled}
			events = append(events, c, record.Settle{Owner: owner, LeaseTTL: time.Minute, Settled: settled})
		}
	}
	for _, result := range []record.Result{record.Paid, record.Refused, record.Unknown, record.NothingSent} {
		for _, owner := range []string{"p/1", "q/1"} {
			for _, row := range []*record.Attempt{nil, &abandoned, &ended} {
				events = append(events, record.Outcome{Owner: owner, Result: result, HTTPRequests: 1, ProviderStatus: 200,
					Reply: []byte(`{"id":1}`), Error: "e", Code: 2, QuietFor: time.Second, SettleAfter: time.Minute, Row: row})
			}
		}
	}
	for _, to := range []record.State{record.Succeeded, record.NotCreated} {
		events = append(events, record.Resolve{To: to, Reply: nil})
	}
	writes := map[record.Write]int{}
	for _, r := range recs {
		for _, ev := range events {
			n, eff := record.Step(r, ev, now)
			if eff.Write == record.WriteNone {
				continue
			}
			writes[eff.Write]++
			cols, ok := writeCols[eff.Write]
			if !ok {
				t.Fatalf("no statement for %v", eff.Write)
			}
			was := record.Record{}
			if r != nil {
				was = *r
			}
			for _, c := range recordCols {
				if slices.Contains(cols, c.name) {
					continue
				}
				if a, b := c.val(sqliteDialect, &was), c.val(sqliteDialect, &n); !reflect.DeepEqual(a, b) {
					t.Errorf("Step(%s, %T %+v) = %v changes %s (%v to %v), which its statement does not set",
						describe(r), ev, ev, eff.Write, c.name, a, b)
				}
			}
		}
	}
	for _, w := range []record.Write{record.WriteInsert, record.WriteAcquire, record.WriteTakeOver, record.WriteAbandon,
		record.WriteGiveUp, record.WriteFinish, record.WriteLate, record.WriteResolve} {
		if writes[w] == 0 {
			t.Errorf("no case made a %v write", w)
		}
	}
}

func describe(r *record.Record) string {
	if r == nil {
		return "no record"
	}
	return fmt.Sprintf("%v record", r.State)
}
