package main

import (
	"fmt"
	"slices"
	"time"

	"example.com/paymentsd/internal/simulator"
)

// resendReason says why a key reached the provider again (again) after a
// 2xx (got) was delivered to a replica: the first reason that applies, in
// resendReasons' order, and a note on what happened.
func resendReason(in checkInput, calls []call, rec record, got, again simulator.KeyRequest) (string, string) {
	k, killed := killedBetween(in.Faults, got.Listener, got.Arrived, minTime(again.Arrived, commitBy(in, got.Ended)))
	switch {
	case killed && k.At.Before(got.Ended):
		return resendKilledAtProvider, fmt.Sprintf("; %s %s, with the request at the provider", got.Listener, died(in, k))
	case killed:
		return resendKilledCommitWindow, fmt.Sprintf("; %s %s, before it could have committed the 2xx (by %s)", got.Listener, died(in, k), offset(in, commitBy(in, got.Ended)))
	}
	if unread, ok := unreadBy(calls, rec, got); ok {
		return resendUnread, fmt.Sprintf("; %s answered the call that carried it %s %s at %s: it had not read the 2xx", got.Listener, unread.Code, unread.Reason, offset(in, unread.End))
	}
	for _, r := range rec.Resolutions {
		if r.NotCreated && r.At.After(got.Ended) && r.At.Before(again.Arrived) {
			return resendResolved, fmt.Sprintf("; a person's NOT_CREATED resolution was accepted at %s", offset(in, r.At))
		}
	}
	if in.LosesCommits {
		// A failover lasts until the fault is undone: a commit made
		// meanwhile, on a promoted node, may be rewound when it ends.
		for _, f := range in.Faults {
			if slices.Contains(failoverFaults, f.Kind) && f.Start.Before(again.Arrived) && (f.Undone.IsZero() || f.Undone.After(got.Ended)) {
				return resendCommitLost, fmt.Sprintf("; %s from %s may have lost the commit (the store may lose acknowledged commits in a failover)", f.Kind, offset(in, f.Start))
			}
		}
	}
	for _, f := range in.Faults {
		if f.Kind == faultReplicaPartition && f.Target == got.Listener && f.Start.Before(got.Ended.Add(in.CommitGrace)) &&
			(f.Undone.IsZero() || f.Undone.After(again.Arrived)) {
			return resendCutOff, fmt.Sprintf("; %s was cut off from the store from %s to %s", got.Listener, offset(in, f.Start), offsetOrEnd(in, f.Undone))
		}
	}
	because := ""
	if k, killed := killedBetween(in.Faults, got.Listener, got.Arrived, again.Arrived); killed {
		because = fmt.Sprintf("; %s lived on, and %s, after it could have committed the 2xx (by %s)",
			got.Listener, died(in, k), offset(in, commitBy(in, got.Ended)))
	}
	return resendLived, because
}

// unreadBy finds the call whose request got the 2xx kr, if its replica
// answered it, after the delivery, that the provider's answer was unknown
// (PAYMENT_OUTCOME_UNKNOWN), and the record shows no attempt that read a
// 2xx and was under way when kr arrived. A replica that read a 2xx answers
// PAYMENT_OUTCOME_UNKNOWN too when its deadline comes before the 2xx is
// committed (told OK means durable); its attempt then shows the 2xx once
// the outbox has written it.
func unreadBy(calls []call, rec record, kr simulator.KeyRequest) (call, bool) {
	for _, t := range rec.Read2xx {
		if !t.After(kr.Arrived) {
			return call{}, false
		}
	}
	for _, c := range calls {
		if c.Kind != kindClient && fmt.Sprintf("r%d", c.Replica) == kr.Listener &&
			!kr.Arrived.Before(c.Start) && !kr.Arrived.After(c.End) && c.End.After(kr.Ended) &&
			c.Answered && c.Reason == "PAYMENT_OUTCOME_UNKNOWN" {
			return c, true
		}
	}
	return call{}, false
}

// killedBetween reports whether a paymentsd-kill, or a compound fault's
// kill (or SIGTERM's drain), struck target between from and to, and how.
func killedBetween(faults []fault, target string, from, to time.Time) (kill, bool) {
	for _, f := range faults {
		kills := f.Kills
		if f.Kind == faultPaymentsdKill {
			kills = append(kills, kill{Target: f.Target, At: f.Start})
		}
		for _, k := range kills {
			if k.Target == target && !k.At.Before(from) && !k.At.After(to) {
				return k, true
			}
		}
	}
	return kill{}, false
}

// died says how and when k ended its replica: "was SIGKILLed at 3.0s", or
// "was sent SIGTERM at 3.0s and stopped writing (its drain over) at 24.0s".
func died(in checkInput, k kill) string {
	if k.Termed.IsZero() {
		return "was SIGKILLed at " + offset(in, k.At)
	}
	return fmt.Sprintf("was sent SIGTERM at %s and stopped writing (its drain over) at %s", offset(in, k.Termed), offset(in, k.At))
}

// storeFaults are the faults that take the record store away.
var storeFaults = []string{faultPostgresKill, faultPostgresStop, faultPostgresFreeze, faultPostgresFreezeKill, faultSQLiteLock,
	faultPostgresFreezeTerm, faultPostgresStopTerm, faultPostgresReadOnly,
	faultPrimaryKill, faultSwitchover, faultPoolerRestart, faultLoseCommits, faultFreezePrimary, faultFailoverAfterUnknown}

// failoverFaults are the faults that promote a standby, or may: where the
// store may lose acknowledged commits (checkInput.LosesCommits), a commit
// made before one may be gone after it.
var failoverFaults = []string{faultPrimaryKill, faultLoseCommits, faultFreezePrimary, faultFailoverAfterUnknown}

// commitBy is the latest a replica that received a 2xx at t could have
// committed it: t plus the grace; or, if the store was down at any time
// before then (at t, or from a fault that began within the grace), the
// store's return plus the grace, and so on while another store fault
// begins before that.
func commitBy(in checkInput, t time.Time) time.Time {
	by := t.Add(in.CommitGrace)
	for changed := true; changed; {
		changed = false
		for _, f := range in.Faults {
			if !slices.Contains(storeFaults, f.Kind) || !f.Start.Before(by) {
				continue
			}
			back := f.Undone
			if back.IsZero() {
				back = in.End
			}
			if t.After(back) {
				continue
			}
			if next := back.Add(in.CommitGrace); next.After(by) {
				by, changed = next, true
			}
		}
	}
	return by
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
