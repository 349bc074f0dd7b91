package main

// Kinds of violation: each is a contradiction between what paymentsd (or
// its client) said or did about money and what the provider saw. The
// first ones are the invariants of issue 30 (invariantOf).
const (
	// I1: the key reached the provider again after a caller had been told
	// OK for it.
	violToldOKSentAgain = "told_ok_sent_again"
	// I2: an OK told to a caller whose key is not SUCCEEDED on record at
	// the end, whatever a person did meanwhile.
	violOKNotOnRecord = "ok_not_on_record"
	// I2: an OK told to a caller with a reply other than the record's.
	violOKReplyDiffers = "ok_reply_differs"
	// I2: PAYMENT_NOT_CREATED (or paymentsclient's ErrNotCreated) for a
	// key the provider created.
	violFalseNotCreated = "false_not_created"
	// I3: two requests with the key at the provider at once.
	violOverlap = "overlap"
	// I4: a person's resolution that paymentsd accepted, and that
	// contradicts what a caller had been told: NOT_CREATED of a key told
	// OK, or SUCCEEDED of a key told NOT_CREATED.
	violResolutionContradicts = "resolution_contradicts_caller"

	// The provider made more than one payment for the key.
	violChargedTwice = "charged_twice"
	// The key reached the provider again after a 2xx for it had been
	// delivered to a replica that lived on, with nothing else to explain
	// it (resendLived); with -strict, after any delivered 2xx.
	violSentAfter2xx = "sent_after_2xx"
	// The record says NOT_CREATED; the provider made the payment, and no
	// person resolved it so.
	violRecordNotCreated = "record_not_created_but_charged"
	// The record says SUCCEEDED; the provider made no payment.
	violRecordNoCharge = "record_succeeded_without_charge"
	// The provider saw the key; paymentsd has no record of it.
	violNoRecord = "sent_without_record"
	// A final refusal (key reused, expired, not owned, invalid) of a valid
	// request with the caller's own key.
	violRefused = "unexpected_refusal"
	// Still IN_PROGRESS, or OUTCOME_UNKNOWN with settlement still due,
	// when the wait for settlement ended.
	violUnsettled = "unsettled"
)

// violationKinds lists every kind, in the order the report prints them.
var violationKinds = []string{
	violToldOKSentAgain, violOKNotOnRecord, violOKReplyDiffers, violFalseNotCreated, violOverlap, violResolutionContradicts,
	violChargedTwice, violSentAfter2xx, violRecordNotCreated, violRecordNoCharge, violNoRecord, violRefused, violUnsettled,
}

// The invariants of issue 30, which the payment engine must keep under
// every fault.
const (
	invI1 = "I1" // a key whose 2xx any caller was told is never sent to the provider again
	invI2 = "I2" // told OK: the record ends SUCCEEDED with that reply; told NOT_CREATED: the provider never created it
	invI3 = "I3" // at most one request per key at the provider at a time
	invI4 = "I4" // no resolution is accepted that contradicts what a caller was told
)

// invariants lists them in order, with what each says.
var invariants = []struct{ name, says string }{
	{invI1, "a key told OK was sent to the provider again"},
	{invI2, "told OK, the record is not SUCCEEDED with that reply; or told NOT_CREATED of a payment"},
	{invI3, "two requests for one key at the provider at once"},
	{invI4, "a resolution accepted that contradicts what a caller was told"},
}

// invariantOf is the invariant a kind of violation breaks, if any.
var invariantOf = map[string]string{
	violToldOKSentAgain:       invI1,
	violOKNotOnRecord:         invI2,
	violOKReplyDiffers:        invI2,
	violFalseNotCreated:       invI2,
	violOverlap:               invI3,
	violResolutionContradicts: invI4,
}

// Why a key reached the provider again after a 2xx for it had been
// delivered to a replica. All but resendLived have a cause outside the
// replica that read the 2xx, and are reported, not counted (unless
// -strict): whether a caller was told OK, which is I1 whatever the
// reason, is judged apart.
const (
	// The replica the 2xx was for was SIGKILLed while its request was at
	// the provider.
	resendKilledAtProvider = "replica_killed_with_request_at_provider"
	// It was SIGKILLed after the delivery, before it could have committed
	// the 2xx: within -commit-grace of it, or of the store's return.
	resendKilledCommitWindow = "replica_killed_in_commit_window"
	// It answered the call that carried the request, after the delivery,
	// that the outcome was unknown: its deadline cut the request off
	// before it read the 2xx (a 2xx written to the connection is not a
	// 2xx read from it).
	resendUnread = "replica_never_read_the_2xx"
	// A person's NOT_CREATED resolution, accepted in between, let the key
	// be sent again as a new attempt.
	resendResolved = "resolved_not_created_by_a_person"
	// The store may lose acknowledged commits in a failover (asynchronous
	// or non-strict synchronous replication), and one came in between.
	resendCommitLost = "commit_lost_in_failover"
	// It was cut off from the store (replica-partition) from before it
	// could have committed the 2xx until after the key was sent again: to
	// the others it looked dead (docs/durability.md's "a replica cut off
	// from the database alone").
	resendCutOff = "replica_cut_off_from_the_store"
	// None of these: the replica lived on with the 2xx. A violation.
	resendLived = "replica_lived_on"
)

// resendReasons lists them in the order the report prints them.
var resendReasons = []string{resendKilledAtProvider, resendKilledCommitWindow, resendUnread, resendResolved, resendCommitLost, resendCutOff, resendLived}

// violation is one key's contradiction of one kind (or, in Resends, one
// key's re-send and its reason).
type violation struct {
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Detail string `json:"detail"`
}
