package main

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/paymentsclient"
)

// check judges a run's history against the provider's facts and
// paymentsd's records.
func check(in checkInput) checkResult {
	res := checkResult{Resolutions: resolutionCounts{Refused: make(map[string]int)}}
	seen := make(map[[2]string]bool) // kind, key: one violation of a kind per key
	flag := func(kind, key, format string, args ...any) {
		if seen[[2]string{kind, key}] {
			return
		}
		seen[[2]string{kind, key}] = true
		res.Violations = append(res.Violations, violation{kind, key, fmt.Sprintf(format, args...)})
	}

	byKey := make(map[string][]call)
	var keys []string
	for _, c := range in.Calls {
		if _, ok := byKey[c.Key]; !ok {
			keys = append(keys, c.Key)
		}
		byKey[c.Key] = append(byKey[c.Key], c)
	}
	for k := range in.Provider {
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k) // the provider saw a key no caller used
		}
	}
	sort.Strings(keys)
	asked := make(map[string][]resolution)
	for _, r := range in.Resolutions {
		asked[r.Key] = append(asked[r.Key], r)
		res.Resolutions.Asked++
		if r.Accepted {
			res.Resolutions.Accepted++
		} else {
			res.Resolutions.Refused[r.Refusal]++
		}
	}

	outcome := make(map[string]string) // key → verdictOK, verdictNotCreated or verdictUnknown
	var settledAt []time.Time          // settlement's first request of each key it settled
	for _, key := range keys {
		calls, facts, rec := byKey[key], in.Provider[key], in.Records[key]
		charged := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Charged })
		resolvedNotCreated := slices.ContainsFunc(rec.Resolutions, func(r recordedResolution) bool { return r.NotCreated })

		// What paymentsd told callers against its record (I2).
		for _, c := range calls {
			switch {
			case c.ok() && (!rec.Found || rec.State != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED):
				flag(violOKNotOnRecord, key, "%s told OK with %s at %s; the record is %s", c.Kind, c.Reply, offset(in, c.End), describe(rec))
			case c.ok() && !bytes.Equal(c.Reply, rec.Reply):
				flag(violOKReplyDiffers, key, "%s told OK with %s at %s; the record holds %s", c.Kind, c.Reply, offset(in, c.End), rec.Reply)
			case c.Verdict == verdictRefused:
				flag(violRefused, key, "%s answered %s %s at %s", c.Kind, c.Code, c.Reason, offset(in, c.End))
			}
		}

		// NOT_CREATED said of a key the provider created (I2).
		if charged >= 0 {
			first := facts.History[charged]
			allAnswered := !slices.ContainsFunc(calls, func(c call) bool { return c.Kind == kindCreate && !c.Answered })
			for _, c := range calls {
				switch {
				case c.Reason == paymentsclient.ReasonNotCreated && !first.Arrived.After(c.End):
					// A request that made the payment had reached the
					// provider before the answer.
					flag(violFalseNotCreated, key, "%s answered %s PAYMENT_NOT_CREATED at %s; a request that made the payment had reached the provider at %s",
						c.Kind, c.Code, offset(in, c.End), offset(in, first.Arrived))
				case c.Kind == kindClient && c.Verdict == verdictNotCreated:
					// The caller pays again under a new key: any payment
					// for this one is a second.
					flag(violFalseNotCreated, key, "paymentsclient.Create returned ErrNotCreated at %s; the provider made the payment (request arrived at %s)",
						offset(in, c.End), offset(in, first.Arrived))
				case c.Kind == kindCreate && c.Final && c.Verdict == verdictNotCreated && allAnswered:
					flag(violFalseNotCreated, key, "the caller's last answer, with every call answered, was %s PAYMENT_NOT_CREATED at %s; the provider made the payment (request arrived at %s)",
						c.Code, offset(in, c.End), offset(in, first.Arrived))
				}
			}
		}

		// Resolutions against what callers were told (I4): those in the
		// record's audit, and those the person was told were accepted
		// (an audit lost with a failover's commits still counts).
		type accepted struct {
			at         time.Time
			notCreated bool
			how        string
		}
		var acc []accepted
		for _, r := range rec.Resolutions {
			acc = append(acc, accepted{r.At, r.NotCreated, "recorded in the audit"})
		}
		for _, r := range asked[key] {
			if r.Accepted {
				acc = append(acc, accepted{r.Start, r.NotCreated, "asked for"})
			}
		}
		for _, a := range acc {
			for _, c := range calls {
				if !c.End.Before(a.at) {
					continue
				}
				switch {
				case a.notCreated && c.ok():
					flag(violResolutionContradicts, key, "a NOT_CREATED resolution %s at %s was accepted; a caller had been told OK at %s", a.how, offset(in, a.at), offset(in, c.End))
				case !a.notCreated && c.Final && c.Verdict == verdictNotCreated:
					flag(violResolutionContradicts, key, "a SUCCEEDED resolution %s at %s was accepted; the caller had been told NOT_CREATED at %s", a.how, offset(in, a.at), offset(in, c.End))
				}
			}
		}
		if resolvedNotCreated && charged >= 0 {
			res.Resolutions.WrongNotCreated++
		}

		// The provider's own counts.
		if facts.Stats.Charges > 1 {
			flag(violChargedTwice, key, "the provider made %d payments from %d requests", facts.Stats.Charges, facts.Stats.Requests)
		}
		if facts.Stats.Overlaps > 0 {
			flag(violOverlap, key, "%d of %d requests arrived while another with the key was at the provider (at most %d at once)",
				facts.Stats.Overlaps, facts.Stats.Requests, facts.Stats.MaxInFlight)
		}

		// Sent again after a delivered 2xx, and why.
		why := ""
		if d := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Delivered }); d >= 0 && facts.Stats.AfterDelivered > 0 {
			got := facts.History[d]
			// The first request to arrive after the delivery (one that
			// arrived before it overlapped, and is counted as such).
			again := facts.History[len(facts.History)-1]
			for _, kr := range facts.History[d+1:] {
				if !kr.Arrived.Before(got.Ended) {
					again = kr
					break
				}
			}
			detail := fmt.Sprintf("%d request(s) after a 2xx was delivered to %s at %s; the first at %s, from %s",
				facts.Stats.AfterDelivered, got.Listener, offset(in, got.Ended), offset(in, again.Arrived), listenerName(again.Listener))
			reason, because := resendReason(in, calls, rec, got, again)
			why = reason
			res.Resends = append(res.Resends, violation{reason, key, detail + because})
			if reason == resendLived || in.Strict {
				flag(violSentAfter2xx, key, "%s%s", detail, because)
			}
		}

		// Told OK, then sent again (I1).
		if i := slices.IndexFunc(calls, call.ok); i >= 0 {
			told := calls[i]
			for _, c := range calls[i:] {
				if c.ok() && c.End.Before(told.End) {
					told = c
				}
			}
			if j := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Arrived.After(told.End) }); j >= 0 {
				kr := facts.History[j]
				because := ""
				if why != "" {
					because = "; the re-send after the delivered 2xx: " + why
				}
				flag(violToldOKSentAgain, key, "%s told OK at %s; the provider got the key again at %s from %s (answered %d)%s",
					told.Kind, offset(in, told.End), offset(in, kr.Arrived), listenerName(kr.Listener), kr.Status, because)
			}
		}

		// The record against the provider.
		switch {
		case rec.Err != "":
			if len(facts.History) > 0 {
				flag(violUnsettled, key, "the record could not be read (%s)", rec.Err)
			}
		case !rec.Found:
			if len(facts.History) > 0 {
				flag(violNoRecord, key, "the provider saw %d request(s) (%d charged); paymentsd has no record", facts.Stats.Requests, facts.Stats.Charges)
			}
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED && charged >= 0 && !resolvedNotCreated:
			flag(violRecordNotCreated, key, "the record is NOT_CREATED; the provider made the payment (request arrived at %s)", offset(in, facts.History[charged].Arrived))
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED && charged < 0:
			flag(violRecordNoCharge, key, "the record is SUCCEEDED with %s; the provider made no payment", rec.Reply)
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS,
			rec.State == paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN && !rec.GaveUp:
			flag(violUnsettled, key, "the record is still %s", describe(rec))
		}

		// What the caller was finally told.
		outcome[key] = verdictUnknown
		for _, c := range calls {
			switch {
			case c.ok():
				outcome[key] = verdictOK
			case c.Final && c.Verdict == verdictNotCreated && outcome[key] != verdictOK:
				outcome[key] = verdictNotCreated
			}
		}
		if len(calls) == 0 {
			continue
		}
		res.Keys.Total++
		switch outcome[key] {
		case verdictOK:
			res.Keys.OK++
		case verdictNotCreated:
			res.Keys.NotCreated++
		default:
			res.Keys.InDoubt++
			if settled(rec) {
				res.Keys.Settled++
			}
		}
		if charged >= 0 {
			res.Keys.Charged++
		}
		if t, ok := sentBySettlement(calls, facts.History); ok && settled(rec) {
			res.Keys.BySettlement++
			settledAt = append(settledAt, t)
		}
	}

	var attempts []call
	for _, c := range in.Calls {
		if c.Kind == kindClient {
			res.Calls.Clients++
			continue
		}
		attempts = append(attempts, c)
		res.Calls.Total++
		if c.REST {
			res.Calls.REST++
			if !c.Answered && !c.ok() {
				res.Calls.Left++
			}
		}
		if !c.ok() {
			res.Calls.Failed++
		}
	}
	res.WithoutOK = longestWithoutOK(in, attempts)
	res.Faults, res.Outside = faultFigures(in, attempts, outcome)
	for _, t := range settledAt {
		for i := len(res.Faults) - 1; i >= 0; i-- {
			if !t.Before(res.Faults[i].Start) {
				res.Faults[i].BySettlement++
				break
			}
		}
	}
	return res
}

// offsetOrEnd is offset, or "the end" for a zero time (never undone).
func offsetOrEnd(in checkInput, t time.Time) string {
	if t.IsZero() {
		return "the end"
	}
	return offset(in, t)
}

// listenerName names the replica whose listener a request came in on.
func listenerName(l string) string {
	if l == "" {
		return "an unknown client"
	}
	return l
}

// longestWithoutOK is the longest stretch from the run's start to its end
// in which no attempt was answered OK.
func longestWithoutOK(in checkInput, attempts []call) gap {
	ends := []time.Time{in.Begin}
	for _, c := range attempts {
		if c.ok() && c.End.After(in.Begin) && c.End.Before(in.End) {
			ends = append(ends, c.End)
		}
	}
	ends = append(ends, in.End)
	slices.SortFunc(ends, time.Time.Compare)
	var g gap
	for i := 1; i < len(ends); i++ {
		if d := ends[i].Sub(ends[i-1]).Seconds(); d > g.Seconds {
			g = gap{Seconds: d, From: ends[i-1].Sub(in.Begin).Seconds(), To: ends[i].Sub(in.Begin).Seconds()}
		}
	}
	return g
}

// sentBySettlement returns the arrival of the first of a key's requests at
// the provider that came while none of its calls was open: settlement's.
func sentBySettlement(calls []call, history []simulator.KeyRequest) (time.Time, bool) {
	for _, kr := range history {
		open := slices.ContainsFunc(calls, func(c call) bool {
			return c.Kind != kindClient && !kr.Arrived.Before(c.Start) && !kr.Arrived.After(c.End)
		})
		if !open {
			return kr.Arrived, true
		}
	}
	return time.Time{}, false
}

// settled reports whether a record's outcome is known: the payment
// exists, or certainly does not (NOT_CREATED, or no record at all: nothing
// is sent before it is recorded).
func settled(r record) bool {
	return r.Err == "" && (!r.Found || r.State == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || r.State == paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED)
}

func describe(r record) string {
	switch {
	case r.Err != "":
		return "unreadable (" + r.Err + ")"
	case !r.Found:
		return "missing"
	case r.GaveUp:
		return r.State.String() + " (settlement gave up)"
	}
	return r.State.String()
}

// offset is t as seconds into the run, for details.
func offset(in checkInput, t time.Time) string {
	return fmt.Sprintf("%.3fs", t.Sub(in.Begin).Seconds())
}
