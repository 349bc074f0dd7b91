package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
)

// These tests check the checker, over hand-written histories: each
// contradiction it must find, and the ones it must not invent.

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

const reply = `{"id":"pay_sim_1"}`

// okCall is a raw caller's call told OK.
func okCall(key string, replica int, start, end float64) call {
	return call{Kind: kindCreate, Key: key, Replica: replica, Start: at(start), End: at(end),
		Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Answered: true, Final: true}
}

// failedCall is a raw caller's call that failed with code and reason.
func failedCall(key string, replica int, start, end float64, code codes.Code, reason string) call {
	return call{Kind: kindCreate, Key: key, Replica: replica, Start: at(start), End: at(end),
		Code: code, Reason: reason, Verdict: verdictRetry, Answered: reason != ""}
}

// paid is the provider's facts for a key paid by one request on listener,
// arriving at arrived and delivered at delivered.
func paid(listener string, arrived, delivered float64) keyFacts {
	return keyFacts{
		Stats:   simulator.KeyStats{Requests: 1, MaxInFlight: 1, Bodies: 1, Charges: 1, Delivered: 1},
		History: []simulator.KeyRequest{{Listener: listener, Arrived: at(arrived), Ended: at(delivered), Status: 200, Charged: true, Delivered: true}},
	}
}

// sentAgain adds to facts a request on listener at s, after the delivered
// 2xx, that the provider answered with the first payment again.
func sentAgain(facts keyFacts, listener string, s float64) keyFacts {
	facts.Stats.Requests++
	facts.Stats.Delivered++
	facts.Stats.AfterDelivered++
	facts.History = append(facts.History, simulator.KeyRequest{Listener: listener, Arrived: at(s), Ended: at(s + 0.1), Status: 200, Delivered: true})
	return facts
}

// resentWith adds kr to facts: a request that arrived after the delivered
// 2xx.
func resentWith(facts keyFacts, kr simulator.KeyRequest) keyFacts {
	facts.Stats.Requests++
	facts.Stats.AfterDelivered++
	facts.History = append(facts.History, kr)
	return facts
}

func succeeded() record {
	return record{Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Reply: []byte(reply)}
}

func stateRecord(s paymentsv1.PaymentState) record { return record{Found: true, State: s} }

// kinds lists the kinds of vs, in order.
func kinds(vs []violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Kind)
	}
	return out
}

func TestCheckViolations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		in     checkInput
		want   []string // kinds of violation
		resent []string // the reasons of re-sends after a delivered 2xx
	}{
		{
			name: "clean",
			in: checkInput{
				Calls: []call{
					failedCall("k", 0, 0, 0.1, codes.Unavailable, "REQUEST_NOT_SENT"),
					okCall("k", 1, 0.2, 1.2),
				},
				Provider: map[string]keyFacts{"k": paid("r1", 0.3, 1.1)},
				Records:  map[string]record{"k": succeeded()},
			},
		},
		{
			name: "OK not on record",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{"k": stateRecord(paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS)},
			},
			want: []string{violOKNotOnRecord, violUnsettled},
		},
		{
			name: "OK with another reply than the record's",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Reply: []byte(`{"id":"pay_sim_2"}`)}},
			},
			want: []string{violOKReplyDiffers},
		},
		{
			name: "charged twice",
			in: checkInput{
				Calls: []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": {
					Stats:   simulator.KeyStats{Requests: 2, Charges: 2, Delivered: 1, MaxInFlight: 1, Bodies: 1},
					History: []simulator.KeyRequest{{Arrived: at(0.1), Ended: at(0.2), Charged: true}, {Arrived: at(0.3), Ended: at(0.9), Status: 200, Charged: true, Delivered: true}},
				}},
				Records: map[string]record{"k": succeeded()},
			},
			want: []string{violChargedTwice},
		},
		{
			name: "overlap",
			in: checkInput{
				Calls: []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": {
					Stats:   simulator.KeyStats{Requests: 2, Charges: 1, Delivered: 1, Overlaps: 1, MaxInFlight: 2, Bodies: 1},
					History: []simulator.KeyRequest{{Arrived: at(0.1), Ended: at(0.9), Status: 200, Charged: true, Delivered: true}, {Arrived: at(0.3), Ended: at(0.95)}},
				}},
				Records: map[string]record{"k": succeeded()},
			},
			want: []string{violOverlap},
		},
		{
			name: "sent again after a 2xx its receiver lived on with",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				// A kill of the other replica excuses nothing.
				Faults: []fault{{Kind: faultPaymentsdKill, Target: "r1", Start: at(5), Undone: at(7)}},
			},
			want:   []string{violSentAfter2xx, violToldOKSentAgain},
			resent: []string{resendLived},
		},
		{
			// The same answer, from a replica that had read the 2xx and
			// could not yet commit it (told OK means durable): its attempt
			// shows the 2xx on record. Found in a strict Patroni run, where
			// the other replica's settlement took the key over 3 ms before
			// the 2xx's commit landed.
			name: "sent again after a 2xx its receiver read, its commit waiting",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "PAYMENT_OUTCOME_UNKNOWN")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Reply: []byte(reply), Read2xx: []time.Time{at(0.05)}}},
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendLived},
		},
		{
			name: "sent again after a 2xx its receiver never read",
			in: checkInput{
				// The call that carried the request was answered, after
				// the delivery, that the provider's answer was unknown.
				Calls:    []call{failedCall("k", 0, 0, 1, codes.DeadlineExceeded, "PAYMENT_OUTCOME_UNKNOWN")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
			},
			resent: []string{resendUnread},
		},
		{
			name: "sent again after a 2xx delivered once its call had been answered",
			in: checkInput{
				// An unknown outcome told before the delivery proves
				// nothing of what the replica read after it.
				Calls:    []call{failedCall("k", 0, 0, 0.5, codes.DeadlineExceeded, "PAYMENT_OUTCOME_UNKNOWN")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendLived},
		},
		{
			name: "sent again after a 2xx its receiver was killed holding",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultPaymentsdKill, Target: "r0", Start: at(0.95), Undone: at(3)}},
			},
			resent: []string{resendKilledCommitWindow},
		},
		{
			name: "sent again after a 2xx its receiver was killed holding while the store was down",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 30)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{
					{Kind: faultPostgresStop, Start: at(0.5), Undone: at(10)},
					{Kind: faultPaymentsdKill, Target: "r0", Start: at(11), Undone: at(13)},
				},
			},
			resent: []string{resendKilledCommitWindow},
		},
		{
			name: "sent again after a 2xx its receiver lived on with, killed later",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 30)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{
					{Kind: faultPostgresStop, Start: at(0.5), Undone: at(10)},
					{Kind: faultPaymentsdKill, Target: "r0", Start: at(20), Undone: at(22)},
				},
			},
			want:   []string{violSentAfter2xx, violToldOKSentAgain},
			resent: []string{resendLived},
		},
		{
			name: "killed receiver, strict",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultPaymentsdKill, Target: "r0", Start: at(0.95), Undone: at(3)}},
				Strict:   true,
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendKilledCommitWindow},
		},
		{
			// Issue 30's finding 3: told OK at its deadline while the 2xx's
			// commit waited on a frozen store; its replica died before
			// the commit, and settlement sent the key again.
			name: "told OK, then sent again after its replica died in the commit window",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 30)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{{Kind: faultPostgresFreezeKill, Start: at(0.5), Undone: at(20),
					Kills: []kill{{Target: "r1", At: at(3)}, {Target: "r0", At: at(5)}}}},
			},
			want:   []string{violToldOKSentAgain},
			resent: []string{resendKilledCommitWindow},
		},
		{
			// postgres-freeze-term: the replica holding the 2xx was sent
			// SIGTERM inside the freeze, and its drain ended (its outbox
			// stopped) before the store came back.
			name: "sent again after its replica drained with the store frozen",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 40)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{{Kind: faultPostgresFreezeTerm, Start: at(0.5), Undone: at(30),
					Kills: []kill{{Target: "r0", Termed: at(2), At: at(23), Killed: true}}}},
			},
			resent: []string{resendKilledCommitWindow},
		},
		{
			// CI's run of 2026-11-29: the 2xx was delivered 30 ms before
			// the store froze, so its commit could not land within the
			// grace; the replica's drain ended inside the freeze.
			name: "sent again after the store froze just after the 2xx, its replica drained inside",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.97), "r1", 57)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{{Kind: faultPostgresFreezeTerm, Start: at(1), Undone: at(46.5),
					Kills: []kill{{Target: "r0", Termed: at(7.6), At: at(28.6), Killed: true}}}},
			},
			resent: []string{resendKilledCommitWindow},
		},
		{
			// The same replica's drain, had the store come back first: it
			// could have written the 2xx, and a re-send is counted.
			name: "sent again after its replica drained with the store back",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 40)},
				Records:  map[string]record{"k": succeeded()},
				Faults: []fault{{Kind: faultPostgresStopTerm, Start: at(0.5), Undone: at(10),
					Kills: []kill{{Target: "r0", Termed: at(2), At: at(23)}}}},
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendLived},
		},
		{
			// replica-partition: the replica holding the 2xx was cut off
			// from the store until after the other sent the key again.
			name: "sent again while its replica was cut off from the store",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultReplicaPartition, Target: "r0", Start: at(0.5), Undone: at(25)}},
			},
			resent: []string{resendCutOff},
		},
		{
			// The partition healed before the re-send: the replica could
			// have written its 2xx.
			name: "sent again after its replica's partition healed",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultReplicaPartition, Target: "r0", Start: at(0.5), Undone: at(10)}},
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendLived},
		},
		{
			name: "sent again after its replica died with the request at the provider",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 0.5, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 20)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultPaymentsdKill, Target: "r0", Start: at(0.5), Undone: at(3)}},
			},
			resent: []string{resendKilledAtProvider},
		},
		{
			// Issue 30's finding 1: an asynchronous failover put the record
			// back at its OUTCOME_UNKNOWN attempt; settlement sent it again.
			name: "told OK, then sent again after a failover that may lose commits",
			in: checkInput{
				Calls:        []call{okCall("k", 0, 0, 1)},
				Provider:     map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.9), "r1", 15)},
				Records:      map[string]record{"k": succeeded()},
				Faults:       []fault{{Kind: faultFailoverAfterUnknown, Target: "n1", Start: at(2), Undone: at(12)}},
				LosesCommits: true,
			},
			want:   []string{violToldOKSentAgain},
			resent: []string{resendCommitLost},
		},
		{
			// Non-strict synchronous replication: the 2xx came while the
			// leader hung, was committed on the standby promoted
			// meanwhile, and rewound when the old leader came back.
			name: "sent again after a 2xx delivered during a failover that may lose commits",
			in: checkInput{
				Calls:        []call{failedCall("k", 0, 0, 10, codes.Unavailable, "")},
				Provider:     map[string]keyFacts{"k": sentAgain(paid("r0", 2.1, 2.9), "r1", 40)},
				Records:      map[string]record{"k": succeeded()},
				Faults:       []fault{{Kind: faultFreezePrimary, Target: "n1", Start: at(2), Undone: at(27)}},
				LosesCommits: true,
			},
			resent: []string{resendCommitLost},
		},
		{
			name: "sent again after a failover, on a store that loses no acknowledged commit",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": sentAgain(paid("r0", 0.1, 0.5), "r1", 15)},
				Records:  map[string]record{"k": succeeded()},
				Faults:   []fault{{Kind: faultPrimaryKill, Target: "n1", Start: at(2), Undone: at(12)}},
			},
			want:   []string{violSentAfter2xx},
			resent: []string{resendLived},
		},
		{
			// Issue 30's second row: the provider answers the re-send 409,
			// the key stays in doubt, and a careless person resolves it
			// NOT_CREATED: I1, I2 and I4 at once.
			name: "told OK, resolved NOT_CREATED by a person, sent again",
			in: checkInput{
				Calls: []call{okCall("k", 0, 0, 1)},
				Provider: map[string]keyFacts{"k": resentWith(paid("r0", 0.1, 0.9), simulator.KeyRequest{
					Listener: "r1", Arrived: at(6), Ended: at(6.5), Status: 409})},
				Records: map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED,
					Resolutions: []recordedResolution{{At: at(5), NotCreated: true}}}},
				Faults: []fault{{Kind: faultPaymentsdKill, Target: "r0", Start: at(1.2), Undone: at(3)}},
			},
			want:   []string{violOKNotOnRecord, violResolutionContradicts, violToldOKSentAgain},
			resent: []string{resendKilledCommitWindow},
		},
		{
			name: "resolved NOT_CREATED by a person, then sent again, no caller told OK",
			in: checkInput{
				Calls: []call{failedCall("k", 0, 0, 0.5, codes.DeadlineExceeded, "PAYMENT_OUTCOME_UNKNOWN")},
				Provider: map[string]keyFacts{"k": resentWith(paid("r0", 0.1, 0.9), simulator.KeyRequest{
					Listener: "r1", Arrived: at(6), Ended: at(6.5), Status: 409})},
				Records: map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED,
					Resolutions: []recordedResolution{{At: at(5), NotCreated: true}}}},
			},
			// The person was wrong; paymentsd had been told nothing it
			// could refuse the resolution with, and told nobody OK.
			resent: []string{resendResolved},
		},
		{
			name: "a resolution accepted against an OK, lost from the record's audit",
			in: checkInput{
				Calls:       []call{okCall("k", 0, 0, 1)},
				Provider:    map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:     map[string]record{"k": succeeded()},
				Resolutions: []resolution{{Key: "k", NotCreated: true, Start: at(4), End: at(4.1), Accepted: true}},
			},
			want: []string{violResolutionContradicts},
		},
		{
			name: "a resolution refused, or accepted before the OK",
			in: checkInput{
				Calls:    []call{okCall("k", 0, 3, 4)},
				Provider: map[string]keyFacts{"k": paid("r0", 3.1, 3.9)},
				Records: map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Reply: []byte(reply),
					Resolutions: []recordedResolution{{At: at(2), NotCreated: true}}}},
				Resolutions: []resolution{
					{Key: "k", NotCreated: true, Start: at(1.9), End: at(2.1), Accepted: true},
					{Key: "k", NotCreated: true, Start: at(5), End: at(5.1), Refusal: "FailedPrecondition PAYMENT_SUCCEEDED"},
				},
			},
		},
		{
			name: "NOT_CREATED while a request that paid was at the provider",
			in: checkInput{
				Calls: []call{
					failedCall("k", 0, 0, 2, codes.Unavailable, "PAYMENT_NOT_CREATED"),
					okCall("k", 1, 3, 4),
				},
				Provider: map[string]keyFacts{"k": paid("r0", 0.5, 3.5)},
				Records:  map[string]record{"k": succeeded()},
			},
			want: []string{violFalseNotCreated},
		},
		{
			name: "transient NOT_CREATED before the request that paid",
			in: checkInput{
				Calls: []call{
					failedCall("k", 0, 0, 0.2, codes.Unavailable, "PAYMENT_NOT_CREATED"),
					okCall("k", 1, 0.5, 1.5),
				},
				Provider: map[string]keyFacts{"k": paid("r1", 0.6, 1.4)},
				Records:  map[string]record{"k": succeeded()},
			},
		},
		{
			name: "final NOT_CREATED, every call answered, then the key paid",
			in: checkInput{
				Calls: []call{{Kind: kindCreate, Key: "k", Start: at(0), End: at(0.2), Code: codes.FailedPrecondition,
					Reason: "PAYMENT_NOT_CREATED", Verdict: verdictNotCreated, Answered: true, Final: true}},
				Provider: map[string]keyFacts{"k": paid("r0", 10, 11)},
				Records:  map[string]record{"k": succeeded()},
			},
			want: []string{violFalseNotCreated},
		},
		{
			name: "final NOT_CREATED after an unanswered call, then the key paid",
			in: checkInput{
				Calls: []call{
					failedCall("k", 0, 0, 0.1, codes.Unavailable, ""),
					{Kind: kindCreate, Key: "k", Start: at(0.2), End: at(0.3), Code: codes.FailedPrecondition,
						Reason: "PAYMENT_NOT_CREATED", Verdict: verdictNotCreated, Answered: true, Final: true},
				},
				Provider: map[string]keyFacts{"k": paid("r0", 10, 11)},
				Records:  map[string]record{"k": succeeded()},
			},
			// paymentsd said what it knew; the caller, not it, was hasty.
		},
		{
			name: "paymentsclient's ErrNotCreated, then the key paid",
			in: checkInput{
				Calls: []call{{Kind: kindClient, Key: "k", Replica: -1, Start: at(0), End: at(0.6), Code: codes.FailedPrecondition,
					Reason: "PAYMENT_NOT_CREATED", Verdict: verdictNotCreated, Final: true}},
				Provider: map[string]keyFacts{"k": paid("r0", 1.5, 2)},
				Records:  map[string]record{"k": succeeded()},
			},
			want: []string{violFalseNotCreated},
		},
		{
			name: "record NOT_CREATED, provider paid",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.DeadlineExceeded, "")},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{"k": stateRecord(paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED)},
			},
			want: []string{violRecordNotCreated},
		},
		{
			name: "record SUCCEEDED, provider made nothing",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.DeadlineExceeded, "")},
				Provider: map[string]keyFacts{},
				Records:  map[string]record{"k": succeeded()},
			},
			want: []string{violRecordNoCharge},
		},
		{
			name: "sent with no record",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{},
			},
			want: []string{violNoRecord},
		},
		{
			name: "never sent, no record",
			in: checkInput{
				Calls:   []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Records: map[string]record{},
			},
		},
		{
			name: "unexpected refusal",
			in: checkInput{
				Calls: []call{{Kind: kindCreate, Key: "k", Start: at(0), End: at(0.1), Code: codes.FailedPrecondition,
					Reason: "IDEMPOTENCY_KEY_REUSED", Verdict: verdictRefused, Answered: true, Final: true}},
				Records: map[string]record{},
			},
			want: []string{violRefused},
		},
		{
			name: "unsettled",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{"k": stateRecord(paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN)},
			},
			want: []string{violUnsettled},
		},
		{
			name: "settlement gave up: a person's, not a violation",
			in: checkInput{
				Calls:    []call{failedCall("k", 0, 0, 1, codes.Unavailable, "")},
				Provider: map[string]keyFacts{"k": paid("r0", 0.1, 0.9)},
				Records:  map[string]record{"k": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN, GaveUp: true}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.in.Begin, tt.in.End, tt.in.CommitGrace = t0, at(60), 2*time.Second
			got := check(tt.in)
			if diff := cmp.Diff(tt.want, kinds(got.Violations)); diff != "" {
				t.Errorf("check() violations (-want +got):\n%s\n%+v", diff, got.Violations)
			}
			if diff := cmp.Diff(tt.resent, kinds(got.Resends)); diff != "" {
				t.Errorf("check() re-send reasons (-want +got):\n%s\n%+v", diff, got.Resends)
			}
		})
	}
}

func TestCheckKeyCounts(t *testing.T) {
	t.Parallel()
	in := checkInput{
		Begin: t0, End: at(60),
		Calls: []call{
			okCall("ok", 0, 0, 1),
			{Kind: kindCreate, Key: "no", Start: at(0), End: at(0.1), Code: codes.FailedPrecondition,
				Reason: "PAYMENT_NOT_CREATED", Verdict: verdictNotCreated, Answered: true, Final: true},
			failedCall("doubt-settled", 1, 0, 1, codes.Unavailable, ""), // settled by settlement's request at 20s
			failedCall("doubt-left", 1, 0, 1, codes.Unavailable, "PAYMENT_OUTCOME_UNKNOWN"),
			failedCall("never-recorded", 1, 0, 1, codes.Unavailable, "REQUEST_NOT_SENT"),
			{Kind: kindClient, Key: "client", Replica: -1, Start: at(0), End: at(1), Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Final: true},
			{Kind: kindAttempt, Key: "client", Replica: 0, Start: at(0), End: at(1), Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Answered: true},
		},
		Provider: map[string]keyFacts{
			"ok":            paid("r0", 0.1, 0.9),
			"doubt-settled": paid("r1", 20, 20.5),
			"client":        paid("r0", 0.1, 0.9),
		},
		Records: map[string]record{
			"ok":             succeeded(),
			"no":             stateRecord(paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED),
			"doubt-settled":  succeeded(),
			"doubt-left":     {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN, GaveUp: true},
			"never-recorded": {},
			"client":         succeeded(),
		},
	}
	got := check(in)
	if len(got.Violations) != 0 {
		t.Errorf("check() violations = %+v, want none", got.Violations)
	}
	want := keyCounts{Total: 6, OK: 2, NotCreated: 1, InDoubt: 3, Settled: 2, Charged: 3, BySettlement: 1}
	if diff := cmp.Diff(want, got.Keys); diff != "" {
		t.Errorf("check() keys (-want +got):\n%s", diff)
	}
	if want := (callCounts{Total: 6, Failed: 4, Clients: 1}); got.Calls != want {
		t.Errorf("check() calls = %+v, want %+v", got.Calls, want)
	}
}

// TestCheckFaultFigures: a fault's window runs from its start to the end of
// the first successful call that started after it was undone, and holds the
// calls that overlap it.
func TestCheckFaultFigures(t *testing.T) {
	t.Parallel()
	in := checkInput{
		Begin: t0, End: at(60),
		Calls: []call{
			okCall("a", 0, 0, 0.1),     // before: outside
			okCall("w", 1, 9.5, 12.9),  // waited through the fault: during
			okCall("b", 0, 10.0, 10.4), // during, a success on the replica left
			failedCall("c", 1, 10.1, 10.2, codes.Unavailable, ""),
			failedCall("c", 0, 10.5, 10.6, codes.Unavailable, "REQUEST_NOT_SENT"),
			failedCall("c", 1, 11.0, 11.1, codes.Unavailable, "REQUEST_NOT_SENT"),
			failedCall("d", 1, 11.5, 12.5, codes.Unavailable, "PAYMENT_OUTCOME_UNKNOWN"),
			okCall("c", 0, 12.8, 13.0), // started before the fault was undone
			okCall("e", 0, 13.2, 13.5), // the first success after: recovered at 13.5
			okCall("f", 0, 14, 14.2),   // after: outside
		},
		// d's outcome was left unknown; settlement sent it at 14.5s.
		Provider: map[string]keyFacts{"d": paid("r0", 14.5, 15)},
		Records:  map[string]record{"d": succeeded()},
		Faults:   []fault{{Kind: "postgres-stop", Start: at(9.9), Undone: at(13.1)}},
	}
	got := check(in)
	if len(got.Faults) != 1 {
		t.Fatalf("check() faults = %+v, want 1", got.Faults)
	}
	fs := got.Faults[0]
	if !fs.Recovered.Equal(at(13.5)) {
		t.Errorf("recovered at %v, want %v", fs.Recovered.Sub(t0), 13.5)
	}
	want := faultStats{
		fault:     in.Faults[0],
		Recovered: fs.Recovered,
		Calls:     8,
		Failed:    4,
		FailedBy: map[string]int{
			"Unavailable":                         1,
			"Unavailable REQUEST_NOT_SENT":        2,
			"Unavailable PAYMENT_OUTCOME_UNKNOWN": 1,
		},
		LongestFailedRun:        4,
		LongestFailedRunSeconds: 2.4, // 10.1 to 12.5
		Unavailable:             2.5, // 10.4 to 12.9
		During:                  fs.During,
		InDoubt:                 1, // d
		Settled:                 1,
		BySettlement:            1,
	}
	if diff := cmp.Diff(want, fs, cmp.AllowUnexported(faultStats{}), cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
		t.Errorf("fault figures (-want +got):\n%s", diff)
	}
	if fs.During.Calls != 8 || got.Outside.Calls != 2 {
		t.Errorf("latency over %d calls during and %d outside, want 8 and 2", fs.During.Calls, got.Outside.Calls)
	}
}

func TestDistribution(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got, want := distribution(ds), (latency{Calls: 100, P50: 50, P99: 99}); got != want {
		t.Errorf("distribution(1..100 ms) = %+v, want %+v", got, want)
	}
	if got := distribution(nil); got != (latency{}) {
		t.Errorf("distribution(nil) = %+v, want zero", got)
	}
}

// TestCheckRunFigures: the longest time without an OK, over the whole run,
// and what the careless person's resolutions came to.
func TestCheckRunFigures(t *testing.T) {
	t.Parallel()
	in := checkInput{
		Begin: t0, End: at(50),
		Calls: []call{
			okCall("a", 0, 9, 10),
			okCall("b", 1, 11, 12),
			failedCall("c", 0, 13, 38, codes.Unavailable, ""),
			{Kind: kindAttempt, Key: "d", Replica: 1, Start: at(39), End: at(40), Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Answered: true},
			{Kind: kindClient, Key: "d", Replica: -1, Start: at(39), End: at(45), Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Final: true},
			// A REST caller that went away, then retried as told.
			{Kind: kindCreate, REST: true, Key: "e", Replica: 0, Start: at(41), End: at(42), Code: codes.DeadlineExceeded, Verdict: verdictRetry},
			{Kind: kindCreate, REST: true, Key: "e", Replica: 1, Start: at(43), End: at(44), Code: codes.OK, Reply: []byte(reply), Verdict: verdictOK, Answered: true, Final: true},
		},
		Provider: map[string]keyFacts{"a": paid("r0", 9.1, 9.9), "b": paid("r1", 11.1, 11.9), "c": paid("r0", 13.1, 13.9), "d": paid("r1", 39.1, 39.9),
			"e": paid("r0", 41.1, 41.9)},
		Records: map[string]record{"a": succeeded(), "b": succeeded(), "d": succeeded(), "e": succeeded(),
			"c": {Found: true, State: paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED, Resolutions: []recordedResolution{{At: at(30), NotCreated: true}}}},
		Resolutions: []resolution{
			{Key: "c", NotCreated: true, Start: at(29.9), End: at(30.1), Accepted: true},
			{Key: "c", NotCreated: true, Start: at(20), End: at(20.1), Refusal: "FailedPrecondition RECORD_CHANGED"},
			{Key: "c", NotCreated: true, Start: at(25), End: at(25.1), Refusal: "FailedPrecondition RECORD_CHANGED"},
		},
	}
	got := check(in)
	if len(got.Violations) != 0 {
		t.Errorf("check() violations = %+v, want none", got.Violations)
	}
	// From b's OK at 12 s to d's attempt's at 40 s (its Create's return
	// at 45 s is the same answer, later).
	if want := (gap{Seconds: 28, From: 12, To: 40}); !cmp.Equal(got.WithoutOK, want, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })) {
		t.Errorf("check() longest without OK = %+v, want %+v", got.WithoutOK, want)
	}
	if want := (callCounts{Total: 6, Failed: 2, Clients: 1, REST: 2, Left: 1}); got.Calls != want {
		t.Errorf("check() calls = %+v, want %+v", got.Calls, want)
	}
	want := resolutionCounts{Asked: 3, Accepted: 1, Refused: map[string]int{"FailedPrecondition RECORD_CHANGED": 2}, WrongNotCreated: 1}
	if diff := cmp.Diff(want, got.Resolutions); diff != "" {
		t.Errorf("check() resolutions (-want +got):\n%s", diff)
	}
}
