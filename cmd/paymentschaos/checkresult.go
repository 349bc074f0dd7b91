package main

import (
	"time"
)

// checkResult is a check's verdict and figures.
type checkResult struct {
	Violations []violation `json:"violations"`
	// Resends are the keys sent again after a 2xx was delivered, one per
	// key, each with its reason as Kind.
	Resends []violation `json:"resends"`
	Keys    keyCounts   `json:"keys"`
	Calls   callCounts  `json:"calls"`
	Faults  []faultStats
	// Outside is the latency of calls that overlap no fault's window.
	Outside latency `json:"outside_faults"`
	// WithoutOK is the longest time in the run in which no call was
	// answered OK.
	WithoutOK gap `json:"longest_without_ok"`
	// Resolutions counts what the person asked and what paymentsd did.
	Resolutions resolutionCounts `json:"resolutions"`
}

// gap is a stretch of the run, in seconds from its start.
type gap struct {
	Seconds float64 `json:"s"`
	From    float64 `json:"from_s"`
	To      float64 `json:"to_s"`
}

// resolutionCounts sums a person's resolutions.
type resolutionCounts struct {
	Asked    int            `json:"asked"`
	Accepted int            `json:"accepted"`
	Refused  map[string]int `json:"refused"`
	// WrongNotCreated counts keys the person got paymentsd to record
	// NOT_CREATED (an accepted resolution in the record's audit) although
	// the provider had made the payment: the person's error, which
	// paymentsd could refuse only if it knew of a 2xx.
	WrongNotCreated int `json:"wrong_not_created"`
}

// keyCounts classifies the keys by what their callers were finally told,
// and what the record says of those left in doubt.
type keyCounts struct {
	Total      int `json:"total"`
	OK         int `json:"ok"`
	NotCreated int `json:"not_created"`
	// InDoubt: the caller gave up without a verdict (or was stopped).
	InDoubt int `json:"in_doubt"`
	// Settled: of those, SUCCEEDED or NOT_CREATED on record afterwards,
	// or never recorded (so never sent).
	Settled int `json:"settled_afterwards"`
	// Charged is how many keys the provider made a payment for.
	Charged int `json:"charged"`
	// BySettlement counts keys whose record settlement settled: the
	// provider got a request for the key while none of its calls was open
	// (so paymentsd's settlement sent it), and the record is SUCCEEDED or
	// NOT_CREATED.
	BySettlement int `json:"settled_by_settlement"`
}

type callCounts struct {
	// Total counts gRPC calls to CreateMultiCardPayment, the raw callers'
	// and paymentsclient's attempts.
	Total  int `json:"total"`
	Failed int `json:"failed"`
	// Clients counts paymentsclient.Create calls.
	Clients int `json:"client_creates"`
	// REST counts the calls of Total made over REST, and Left those whose
	// caller went away before the answer.
	REST int `json:"rest,omitempty"`
	Left int `json:"rest_left,omitempty"`
}

// latency is a latency distribution in milliseconds.
type latency struct {
	Calls int     `json:"calls"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
}

// faultStats is what a fault cost callers.
type faultStats struct {
	fault
	// Recovered is the end of the first successful call that started after
	// the fault was undone: the fault's window runs from Start to it (or to
	// the next fault, or the end of the run).
	Recovered time.Time `json:"-"`
	// Calls counts the gRPC calls that overlap the window, and Failed
	// those that failed.
	Calls  int `json:"calls"`
	Failed int `json:"failed"`
	// FailedBy counts the failed calls by "CODE REASON".
	FailedBy map[string]int `json:"failed_by"`
	// LongestFailedRun is the longest run of consecutive failed calls (by
	// start), and LongestFailedRunSeconds its span, from the first one's
	// start to the last one's end.
	LongestFailedRun        int     `json:"longest_failed_run_calls"`
	LongestFailedRunSeconds float64 `json:"longest_failed_run_s"`
	// Unavailable is the longest stretch of the window in which no call
	// succeeded, in seconds.
	Unavailable float64 `json:"unavailable_s"`
	During      latency `json:"during"`
	// InDoubt counts keys with a call in the window whose caller ended
	// without a verdict; Settled, those SUCCEEDED or NOT_CREATED on record
	// afterwards, or never recorded.
	InDoubt int `json:"in_doubt"`
	Settled int `json:"settled_afterwards"`
	// BySettlement counts keys settled by settlement (keyCounts) whose
	// settlement request came after this fault began and before the next.
	BySettlement int `json:"settled_by_settlement"`
}
