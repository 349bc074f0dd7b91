package record

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The model the checker explores (see check_test.go). Its state is one
// value of fixed size made only of one-byte fields, so that it copies by
// assignment and hashes as its bytes (check_explore_test.go).

// tick is a model time: whole seconds since checkEpoch; never is the zero
// time.
type tick int8

const never tick = math.MinInt8

var checkEpoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func (t tick) time() time.Time {
	if t == never {
		return time.Time{}
	}
	return checkEpoch.Add(time.Duration(t) * time.Second)
}

func tickOf(t time.Time) tick {
	if t.IsZero() {
		return never
	}
	d := t.Sub(checkEpoch) / time.Second
	if d < -127 || d > 127 {
		panic(fmt.Sprintf("check: time %v out of the model's range", t))
	}
	return tick(d)
}

func ticks(n int) time.Duration { return time.Duration(n) * time.Second }

// Sizes of the state's tables; a schedule that would overflow one panics
// (raise the size).
const (
	maxProcs    = 2
	maxKeys     = 2
	maxAttempts = 3
	maxEntries  = 6
	maxHung     = 3
	maxRows     = 6
	maxReqs     = 2
)

// owner is a lease owner, "p<process>.<incarnation>/c<claim>"; p is 1-based,
// the zero owner is none. Claim ids are the smallest free in the state, so
// that states differing only in spent ids are one state.
type owner struct{ p, inc, c int8 }

func (o owner) String() string {
	if o.p == 0 {
		return ""
	}
	if int(o.p) < len(ownerNames) && int(o.inc) < len(ownerNames[0]) && int(o.c) < len(ownerNames[0][0]) {
		return ownerNames[o.p][o.inc][o.c]
	}
	return fmt.Sprintf("p%d.%d/c%d", o.p, o.inc, o.c)
}

// ownerNames are the owners' strings, made once: Step is called with
// them on every step explored.
var ownerNames = func() (n [maxProcs + 1][8][16]string) {
	for p := range n {
		for i := range n[p] {
			for c := range n[p][i] {
				n[p][i][c] = fmt.Sprintf("p%d.%d/c%d", p, i, c)
			}
		}
	}
	return n
}()

// code is a provider status, compactly.
type code int8

const (
	noStatus code = iota
	status200
	status409
	status401
)

func (c code) http() int { return [...]int{0, 200, 409, 401}[c] }

func codeOf(status int) code {
	switch status {
	case 0:
		return noStatus
	case 200:
		return status200
	case 409:
		return status409
	case 401:
		return status401
	}
	panic(fmt.Sprintf("check: status %d", status))
}

// mrec is a Record as the model stores it: the fields Step reads or that
// tell states apart. state 0: no record.
type mrec struct {
	state, prior                               State
	kind                                       Kind
	status                                     code
	reply                                      int8 // the payment's number; 0: none
	gaveUp                                     bool
	owner                                      owner
	leaseExp, quietUntil, settleBy, nextSettle tick
	resolvedAt, attemptAt                      tick
}

var keyNames = [maxKeys]string{"k0", "k1"}

func keyName(k int8) string { return keyNames[k] }

func bodyOf(k int8) [32]byte { return [32]byte{0: byte(k) + 1} }

// replies are the payments' bodies, shared: nothing changes them.
var replies = [...][]byte{nil, {1}, {2}, {3}}

func replyBytes(n int8) []byte { return replies[n] }

func replyOf(b []byte) int8 {
	if len(b) == 0 {
		return 0
	}
	return int8(b[0])
}

// record is m as a Record (nil when there is none).
func (m mrec) record(k int8) *Record {
	if m.state == 0 {
		return nil
	}
	r := m.value(k)
	return &r
}

func (m mrec) value(k int8) Record {
	return Record{
		Key: keyName(k), BodySHA256: bodyOf(k), State: m.state, PriorState: m.prior, AttemptKind: m.kind,
		ProviderStatus: m.status.http(), Reply: replyBytes(m.reply), GaveUp: m.gaveUp,
		LeaseOwner: m.owner.String(), LeaseExpiresAt: m.leaseExp.time(), QuietUntil: m.quietUntil.time(),
		SettleBy: m.settleBy.time(), NextSettleAt: m.nextSettle.time(), ResolvedAt: m.resolvedAt.time(),
		AttemptStartedAt: m.attemptAt.time(),
	}
}

// ownerOf maps an owner string Step wrote back to one of the owners it
// could be.
func ownerOf(s string, candidates ...owner) owner {
	if s == "" {
		return owner{}
	}
	for _, o := range candidates {
		if o.String() == s {
			return o
		}
	}
	panic(fmt.Sprintf("check: owner %q from nowhere", s))
}

func mrecOf(r Record, candidates ...owner) mrec {
	return mrec{
		state: r.State, prior: r.PriorState, kind: r.AttemptKind, status: codeOf(r.ProviderStatus),
		reply: replyOf(r.Reply), gaveUp: r.GaveUp, owner: ownerOf(r.LeaseOwner, candidates...),
		leaseExp: tickOf(r.LeaseExpiresAt), quietUntil: tickOf(r.QuietUntil), settleBy: tickOf(r.SettleBy),
		nextSettle: tickOf(r.NextSettleAt), resolvedAt: tickOf(r.ResolvedAt), attemptAt: tickOf(r.AttemptStartedAt),
	}
}

// row is the journal row of an attempt the store ended: what
// Outcome.Row needs.
type row struct {
	used      bool
	key       int8
	owner     owner
	abandoned bool
}

// opKind is what a store operation does.
type opKind int8

const (
	opClaim opKind = iota + 1
	opSettle
	opFinish
	opRelease
)

// entry is an outcome in a process's outbox, or a release of a claim
// whose commit is unknown (untracked: settlement's, which names no key to
// the outbox).
type entry struct {
	used      bool
	key       int8
	owner     owner
	op        opKind // opFinish or opRelease
	untracked bool
	result    Result
	status    code
	reply     int8
	sent      bool
	quietFor  int8
	hung      bool // its write is hung in the store
}

// attempt is a request a process sent and waits on.
type attempt struct {
	used          bool
	key           int8
	owner         owner
	start, sendBy tick
}

type proc struct {
	inc int8
	// healthy is since when the process's store writes have been healthy
	// (never: not yet).
	healthy  tick
	attempts [maxAttempts]attempt
	outbox   [maxEntries]entry
}

// hungOp is a store operation whose commit is pending: it commits (or
// fails) at a later step, whatever became of its author.
type hungOp struct {
	used             bool
	p, inc           int8 // its author
	op               opKind
	key              int8
	owner            owner
	settled, pending bool  // the facts as they were when it was issued
	deadline         tick  // opClaim: its caller's
	out              entry // opFinish, opRelease: what it writes
}

// req is a request at the provider.
type req struct {
	used  bool
	owner owner
	start tick
}

type provKey struct {
	reqs     [maxReqs]req
	created  bool // the payment exists
	wrote2xx bool // the provider has answered 2xx for the key
}

// Phases of a caller's call.
const (
	idle int8 = iota
	claimHung
	awaiting
	attached
)

// caller is the one caller of a key: its calls, one at a time.
type caller struct {
	calls    int8
	done     bool // told OK or NOT_CREATED
	phase    int8
	p, inc   int8 // the process the call is at
	deadline tick
	owner    owner // the call's claim (claimHung, attached)
	sawMaybe bool
	fresh    bool
	sent     bool
	result   Result
	reply    int8
	landed   int8 // 0: not yet; landedWritten; landedLost
}

const (
	landedWritten int8 = iota + 1
	landedLost
)

// told is what callers were told about a key.
type told struct {
	ok    bool
	reply int8
	nc    bool
}

// state is the whole model: store, processes, provider, callers.
type state struct {
	now      tick
	faults   int8
	store    [maxKeys]mrec
	rows     [maxRows]row
	base     [maxKeys]mrec // the store as its replica has it (Rollback)
	baseRows [maxRows]row
	hung     [maxHung]hungOp
	procs    [maxProcs]proc
	prov     [maxKeys]provKey
	callers  [maxKeys]caller
	told     [maxKeys]told
}

// Times are in ticks.
type times struct {
	Lease, Quiet, Grace, Deadline, SettleAfter, Window int
}

// providerMode is how the provider answers a key it has created a payment for.
type providerMode int8

const (
	// reuseFirst: the first payment, 2xx.
	reuseFirst providerMode = iota
	// reuse409: 409, which proves nothing (Unknown).
	reuse409
)

func (m providerMode) String() string { return [...]string{"reuse-first", "reuse-409"}[m] }

// rules switch the checked rules back to earlier ones.
type rules struct {
	// OKAtDeadline: a caller whose 2xx is received but not committed is
	// told OK at its deadline (the rule before issue 30).
	OKAtDeadline bool
	// IgnorePending: claims and settlement do not ask their own outbox
	// (Pending is always false).
	IgnorePending bool
	// NoAnswerBy: a claim carries no AnswerBy, so one that runs after its
	// caller left may acquire the record (the rules as first written).
	NoAnswerBy bool
	// IssuedFacts: a claim or settlement that runs late (hung) brings the
	// facts Settled and Pending as they were when it was issued, not as
	// they are when it runs: settlement asking its outbox before its
	// transaction, rather than in it.
	IssuedFacts bool
	// AnswerResolved: a call that waited on another claim of its key is
	// answered from the record as that claim left it, a person's
	// NOT_CREATED included, rather than as TellFrom says (the engine's
	// Busy branch as first written).
	AnswerResolved bool
	// LateOwnReply: a call whose 2xx landed late (Late: its claim had
	// lost the record) is told OK with its own reply, not with the one the
	// record holds (the engine before it read the record back).
	LateOwnReply bool
}

// bound bounds the exploration.
type bound struct {
	Name     string
	Replicas int
	Keys     int
	// Calls is how many calls each key's caller makes at most.
	Calls int
	// Faults is how many faults a schedule has at most: store operations
	// that fail, hang or lose their acknowledgement, replies the provider
	// loses, crashes, failovers that lose commits.
	Faults int
	// Off are the kinds of fault that never happen.
	Off faultKinds
	// Time, if not 0, is the last tick; Depth the most steps in a
	// schedule.
	Time, Depth int
	Mode        providerMode
	// Refusals: the provider may refuse a request (401).
	Refusals bool
	// Rollback: the store may lose its unreplicated commits (an
	// asynchronous failover).
	Rollback bool
	// NoPerson: no one resolves keys.
	NoPerson bool
	// PersonFinds: the person may also resolve a key in doubt SUCCEEDED,
	// with the payment as they found it (found: a copy of the provider's
	// reply that is not byte for byte the one paymentsd received).
	PersonFinds bool
	// SlowOutbox: a process's outbox may leave an entry unwritten while
	// time passes with no fault its process sees (a process that stalls).
	SlowOutbox bool
	Times      times
	Rules      rules
}

// faultKinds is a set of kinds of fault.
type faultKinds uint8

const (
	// faultFail: a store operation fails; nothing is written.
	faultFail faultKinds = 1 << iota
	// faultAckLost: a store operation commits and its author hears it failed.
	faultAckLost
	// faultHang: a store operation's commit is pending while time passes: it
	// ran late (queued in a pooler) or its commit is stuck; it commits or
	// fails later, and while it hangs its process's writes are not healthy.
	faultHang
	// faultCrash: a process dies and restarts with a new name, its memory
	// lost; its requests at the provider stay there.
	faultCrash
	// faultLostReply: the provider's reply to a request never arrives.
	faultLostReply
)

func (f faultKinds) String() string {
	var names []string
	for i, n := range []string{"fail", "ack lost", "hang", "crash", "lost reply"} {
		if f&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// act is one step of a schedule.
type act struct {
	kind    actKind
	a, b, v int8
}

type actKind int8

const (
	actTick actKind = iota + 1
	actCall
	actReread
	actProvider
	actWrite
	actSettle
	actResolve
	actCrash
	actHung
	actReplicate
	actRollback
)

// Variants of a store operation.
const (
	opOK int8 = iota
	opFails
	opAckLost
	opHangs
)

var opVariant = [...]string{"", " (fails: nothing written)", " (commits, acknowledgement lost)", " (hangs)"}

// A person's finding (act.b of actResolve): NOT_CREATED, or SUCCEEDED with
// the payment as found.
const (
	resolveNotCreated int8 = iota
	resolveFound
)

// found is the payment as a person found it (bound.PersonFinds).
const found int8 = 3

// Provider answers (act.b) and deliveries (act.v).
const (
	provAccept int8 = iota
	provRefuse
)

func (a act) String() string {
	switch a.kind {
	case actTick:
		return "tick"
	case actCall:
		return fmt.Sprintf("caller k%d calls p%d%s", a.a, a.b+1, opVariant[a.v])
	case actReread:
		return fmt.Sprintf("caller k%d rereads%s", a.a, opVariant[a.v])
	case actProvider:
		s := fmt.Sprintf("provider answers k%d", a.a)
		if a.b == provRefuse {
			s = fmt.Sprintf("provider refuses k%d", a.a)
		}
		if a.v == 1 {
			s += " (reply lost)"
		}
		return s
	case actWrite:
		return fmt.Sprintf("outbox p%d writes k%d%s", a.a+1, a.b, opVariant[a.v])
	case actSettle:
		return fmt.Sprintf("settlement p%d claims k%d%s", a.a+1, a.b, opVariant[a.v])
	case actResolve:
		if a.b == resolveFound {
			return fmt.Sprintf("person resolves k%d succeeded", a.a)
		}
		return fmt.Sprintf("person resolves k%d not_created", a.a)
	case actCrash:
		return fmt.Sprintf("p%d crashes and restarts", a.a+1)
	case actHung:
		if a.v == 0 {
			return fmt.Sprintf("hung op #%d commits", a.a)
		}
		return fmt.Sprintf("hung op #%d fails", a.a)
	case actReplicate:
		return "replica catches up"
	case actRollback:
		return "failover loses unreplicated commits"
	}
	return "?"
}

// invariant names an invariant a step broke.
type invariant string

// outcome of one step: its notes for the schedule's log, the invariant it
// broke, and whether it sent a key again after the provider wrote a 2xx
// for it.
type result struct {
	notes     []string
	violation invariant
	why       string
	resent2xx bool
	// ownPaid: the step sent a key whose 2xx its sender's own outbox
	// holds, not yet written (what the Pending fact prevents).
	ownPaid bool
}

// world is a step in progress: the state being changed and what came of it.
type world struct {
	s   *state
	b   *bound
	res result
	// verbose: keep notes (describe); the search does without.
	verbose bool
}

func (w *world) note(format string, args ...any) {
	if w.verbose {
		w.res.notes = append(w.res.notes, fmt.Sprintf(format, args...))
	}
}

func (w *world) violate(v invariant, format string, args ...any) {
	if w.res.violation == "" {
		w.res.violation, w.res.why = v, fmt.Sprintf(format, args...)
	}
}

func initial(b *bound) state {
	var s state
	for i := range s.store {
		s.store[i] = mrec{leaseExp: never, quietUntil: never, settleBy: never, nextSettle: never, resolvedAt: never, attemptAt: never}
	}
	s.base = s.store
	for i := range s.procs {
		// Healthy long enough: settled from the start.
		s.procs[i].healthy = tick(-b.Times.Grace)
	}
	return s
}

// actions lists the steps enabled in s, in a fixed order.
func (s *state) actions(b *bound, as []act) []act {
	as = as[:0]
	faultsLeft := int(s.faults) < b.Faults
	variants := func(kind actKind, x, y int8) {
		as = append(as, act{kind: kind, a: x, b: y})
		if faultsLeft {
			for v, f := range [...]faultKinds{opFails: faultFail, opAckLost: faultAckLost, opHangs: faultHang} {
				if f != 0 && b.Off&f == 0 {
					as = append(as, act{kind: kind, a: x, b: y, v: int8(v)})
				}
			}
		}
	}
	if s.tickEnabled(b) {
		as = append(as, act{kind: actTick})
	}
	for k := int8(0); k < int8(b.Keys); k++ {
		c := &s.callers[k]
		if c.phase == idle && !c.done && int(c.calls) < b.Calls {
			for p := int8(0); p < int8(b.Replicas); p++ {
				variants(actCall, k, p)
			}
		}
		if c.phase == awaiting && !s.pending(c.p, k) {
			r := s.store[k]
			switch {
			case r.state == InProgress && s.now < r.leaseExp:
			case b.Rules.from(r.record(k)) == Wait:
				variants(actReread, k, 0)
			default:
				as = append(as, act{kind: actReread, a: k})
			}
		}
		if q := s.prov[k].reqs[0]; q.used {
			for _, ans := range []int8{provAccept, provRefuse} {
				if ans == provRefuse && !b.Refusals {
					continue
				}
				as = append(as, act{kind: actProvider, a: k, b: ans})
				if faultsLeft && b.Off&faultLostReply == 0 {
					as = append(as, act{kind: actProvider, a: k, b: ans, v: 1})
				}
			}
		}
	}
	for p := int8(0); p < int8(b.Replicas); p++ {
		for k := int8(0); k < int8(b.Keys); k++ {
			if i := s.procs[p].head(k); i >= 0 && !s.procs[p].outbox[i].hung {
				variants(actWrite, p, k)
			}
		}
	}
	for p := int8(0); p < int8(b.Replicas); p++ {
		for k := int8(0); k < int8(b.Keys); k++ {
			if st := s.store[k].state; st != InProgress && st != OutcomeUnknown {
				continue
			}
			// Only the process part of the owner matters to whether
			// settlement would change the record.
			o := owner{p: p + 1, inc: s.procs[p].inc}
			r := s.store[k].value(k)
			if _, eff := Step(&r, s.settleEvent(b, p, k, o), s.now.time()); eff.Write != WriteNone {
				variants(actSettle, p, k)
			}
		}
	}
	if !b.NoPerson {
		for k := int8(0); k < int8(b.Keys); k++ {
			if s.store[k].state != OutcomeUnknown {
				continue
			}
			r := s.store[k].value(k)
			if _, eff := Step(&r, Resolve{To: NotCreated}, s.now.time()); eff.Verdict == Resolved {
				as = append(as, act{kind: actResolve, a: k})
				if b.PersonFinds {
					as = append(as, act{kind: actResolve, a: k, b: resolveFound})
				}
			}
		}
	}
	if faultsLeft && b.Off&faultCrash == 0 {
		for p := int8(0); p < int8(b.Replicas); p++ {
			as = append(as, act{kind: actCrash, a: p})
		}
	}
	for i, h := range s.hung {
		if !h.used {
			continue
		}
		// A hung operation is one that ran late (queued in a pooler, say)
		// or whose commit is stuck: either way its process must be alive
		// to commit it (a commit stuck after its process died is an
		// acknowledgement lost, then a crash).
		if s.procs[h.p].inc == h.inc {
			as = append(as, act{kind: actHung, a: int8(i)})
		}
		as = append(as, act{kind: actHung, a: int8(i), v: 1})
	}
	if b.Rollback && faultsLeft && s.base != s.store {
		as = append(as, act{kind: actReplicate})
		if !s.anyHung() {
			as = append(as, act{kind: actRollback})
		}
	}
	return as
}

// tickEnabled: time may pass unless it is over; or a request at the
// provider would outlive the quiet period counted from its start (the
// provider's promise, which QuietUntil relies on); or a process that saw
// no store fault this tick has an outbox entry to write (the takeover
// grace relies on a healthy process's outbox landing promptly: it is
// slow only by a fault, a failure or a hang, which counts).
func (s *state) tickEnabled(b *bound) bool {
	if b.Time > 0 && int(s.now) >= b.Time {
		return false
	}
	for p := 0; p < b.Replicas && !b.SlowOutbox; p++ {
		pr := &s.procs[p]
		if pr.healthy == s.now {
			continue
		}
		for k := int8(0); k < int8(b.Keys); k++ {
			if i := pr.head(k); i >= 0 && !pr.outbox[i].hung {
				return false
			}
		}
	}
	for k := 0; k < b.Keys; k++ {
		for _, q := range s.prov[k].reqs {
			if q.used && int(q.start)+b.Times.Quiet <= int(s.now)+1 {
				return false
			}
		}
	}
	return true
}

func (s *state) anyHung() bool {
	for _, h := range s.hung {
		if h.used {
			return true
		}
	}
	return false
}

// head is the index of the first outbox entry for k, or -1: an outbox
// writes a key's entries in order.
func (p *proc) head(k int8) int {
	for i, e := range p.outbox {
		if e.used && e.key == k {
			return i
		}
	}
	return -1
}

// pending reports whether process p's outbox holds an entry for k (the
// engine's outbox.pendingFor).
func (s *state) pending(p, k int8) bool {
	for _, e := range s.procs[p].outbox {
		if e.used && e.key == k && !e.untracked {
			return true
		}
	}
	return false
}

// settled is the Settled fact of process p: its store writes have been
// healthy for the takeover grace, and none of them hangs.
func (s *state) settled(b *bound, p int8) bool {
	pr := &s.procs[p]
	for _, h := range s.hung {
		if h.used && h.p == p && h.inc == pr.inc {
			return false
		}
	}
	return pr.healthy != never && int(s.now)-int(pr.healthy) >= b.Times.Grace
}

func (s *state) factPending(b *bound, p, k int8) bool {
	return !b.Rules.IgnorePending && s.pending(p, k)
}

func (s *state) settleEvent(b *bound, p, k int8, o owner) Settle {
	return Settle{Owner: o.String(), LeaseTTL: ticks(b.Times.Lease), Quiet: ticks(b.Times.Quiet),
		Settled: s.settled(b, p), Pending: s.factPending(b, p, k)}
}

func (s *state) claimEvent(b *bound, k int8, o owner, settled, pending bool, deadline tick) Claim {
	c := Claim{
		Request: Request{Key: keyName(k), BodySHA256: bodyOf(k), RequestID: "r"},
		Owner:   o.String(), LeaseTTL: ticks(b.Times.Lease), Window: ticks(b.Times.Window), Quiet: ticks(b.Times.Quiet),
		Settled: settled, Pending: pending,
	}
	if !b.Rules.NoAnswerBy {
		c.AnswerBy = deadline.time()
	}
	return c
}

// newOwner is a claim of process p, with the smallest id no part of the
// state refers to.
func (s *state) newOwner(p int8) owner {
	inc := s.procs[p].inc
	var used [16]bool
	mark := func(o owner) {
		if o.p == p+1 && o.inc == inc {
			used[o.c] = true
		}
	}
	s.owners(mark)
	for c := range used {
		if !used[c] {
			return owner{p: p + 1, inc: inc, c: int8(c)}
		}
	}
	panic("check: out of claim ids")
}

// owners calls f for every owner the state refers to.
func (s *state) owners(f func(owner)) {
	for i := range s.store {
		f(s.store[i].owner)
		f(s.base[i].owner)
	}
	for i := range s.rows {
		f(s.rows[i].owner)
		f(s.baseRows[i].owner)
	}
	s.liveOwners(f)
	for _, pk := range s.prov {
		for _, q := range pk.reqs {
			f(q.owner)
		}
	}
	for _, c := range s.callers {
		f(c.owner)
	}
}

// liveOwners calls f for the owners that may yet write an Outcome.
func (s *state) liveOwners(f func(owner)) {
	for _, h := range s.hung {
		if h.used {
			f(h.owner)
		}
	}
	for _, p := range s.procs {
		for _, a := range p.attempts {
			if a.used {
				f(a.owner)
			}
		}
		for _, e := range p.outbox {
			if e.used {
				f(e.owner)
			}
		}
	}
}

// gcRows forgets the journal rows no Outcome can ask for any more, and
// keeps the rest sorted.
func (s *state) gcRows() {
	gc := func(rows *[maxRows]row) {
		var kept [maxRows]row
		n := 0
		for _, r := range rows {
			if !r.used {
				continue
			}
			live := false
			s.liveOwners(func(o owner) { live = live || o == r.owner })
			if live {
				kept[n] = r
				n++
			}
		}
		// Insertion sort by key, owner.
		for i := 1; i < n; i++ {
			for j := i; j > 0 && rowLess(kept[j], kept[j-1]); j-- {
				kept[j], kept[j-1] = kept[j-1], kept[j]
			}
		}
		*rows = kept
	}
	gc(&s.rows)
	gc(&s.baseRows)
}

func rowLess(a, b row) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	if a.owner.p != b.owner.p {
		return a.owner.p < b.owner.p
	}
	if a.owner.inc != b.owner.inc {
		return a.owner.inc < b.owner.inc
	}
	return a.owner.c < b.owner.c
}

func (s *state) findRow(k int8, o owner) *Attempt {
	for _, r := range s.rows {
		if r.used && r.key == k && r.owner == o {
			return &Attempt{Owner: o.String(), Abandoned: r.abandoned, State: OutcomeUnknown}
		}
	}
	return nil
}

func (s *state) putRow(k int8, o owner, abandoned bool) {
	for i := range s.rows {
		if s.rows[i].used && s.rows[i].key == k && s.rows[i].owner == o {
			s.rows[i].abandoned = abandoned
			return
		}
	}
	for i := range s.rows {
		if !s.rows[i].used {
			s.rows[i] = row{used: true, key: k, owner: o, abandoned: abandoned}
			return
		}
	}
	panic("check: out of journal rows")
}

// apply runs Step on key k's committed record and commits what it
// returns, with the journal rows its effect writes.
func (w *world) apply(k int8, ev Event, evOwner owner) (Record, Effect) {
	s := w.s
	old := s.store[k]
	n, eff := Step(old.record(k), ev, s.now.time())
	if eff.Write == WriteNone {
		return n, eff
	}
	s.store[k] = mrecOf(n, evOwner, old.owner)
	if eff.Ended != nil {
		s.putRow(k, ownerOf(eff.Ended.Owner, evOwner, old.owner), eff.Ended.Abandoned)
	}
	if eff.Rewritten != nil {
		s.putRow(k, ownerOf(eff.Rewritten.Owner, evOwner, old.owner), eff.Rewritten.Abandoned)
	}
	if ev, ok := ev.(Resolve); ok && eff.Verdict == Resolved {
		w.note("k%d resolved %v", k, ev.To)
		if s.told[k].ok && ev.To != Succeeded {
			w.violate("I4", "a person's %v resolution of k%d was accepted after a caller was told OK", ev.To, k)
		}
		if s.told[k].nc && ev.To == Succeeded {
			w.violate("I4", "a person's %v resolution of k%d was accepted after a caller was told NOT_CREATED", ev.To, k)
		}
	}
	return n, eff
}

// outcomeEvent is e as the Outcome its write applies.
func (s *state) outcomeEvent(b *bound, e entry) Outcome {
	o := Outcome{Owner: e.owner.String(), Result: e.result, ProviderStatus: e.status.http(), Reply: replyBytes(e.reply),
		QuietFor: ticks(int(e.quietFor)), SettleAfter: ticks(b.Times.SettleAfter)}
	if e.sent {
		o.HTTPRequests = 1
	}
	if r := s.store[e.key]; r.state != InProgress || r.owner != e.owner {
		o.Row = s.findRow(e.key, e.owner)
	}
	return o
}

// write applies e, an outbox entry, to the store: a Finish, or a Release,
// which ends the claim only if it holds the record. It returns the
// verdict (0: a release that found nothing to release).
func (w *world) write(e entry) Verdict {
	s := w.s
	if e.op == opRelease {
		if r := s.store[e.key]; r.state != InProgress || r.owner != e.owner {
			return 0
		}
		_, eff := w.apply(e.key, Outcome{Owner: e.owner.String(), Result: NothingSent, SettleAfter: ticks(w.b.Times.SettleAfter)}, e.owner)
		return eff.Verdict
	}
	_, eff := w.apply(e.key, s.outcomeEvent(w.b, e), e.owner)
	return eff.Verdict
}

// sawMaybe: a claim reading r reads a record on which an earlier attempt
// may have created a payment.
func sawMaybe(r mrec) bool {
	return r.state == InProgress || r.state == OutcomeUnknown || r.state == Succeeded
}

func (w *world) step(a act) {
	s, b := w.s, w.b
	switch a.kind {
	case actTick:
		s.now++
		for p := range s.procs {
			pr := &s.procs[p]
			for i := range pr.attempts {
				at := pr.attempts[i]
				if at.used && s.now >= at.sendBy {
					quiet := max(0, int(at.start)+b.Times.Quiet-int(s.now))
					w.note("p%d's request for k%d cut off at its lease's end", p+1, at.key)
					w.endAttempt(int8(p), i, Unknown, noStatus, 0, int8(quiet))
				}
			}
		}
	case actCall:
		c := &s.callers[a.a]
		c.calls++
		*c = caller{calls: c.calls, p: a.b, inc: s.procs[a.b].inc, deadline: s.now + tick(b.Times.Deadline)}
		w.claim(a.a, a.v)
	case actReread:
		if !w.answerFrom(a.a, s.store[a.a]) {
			w.claim(a.a, a.v)
		}
	case actProvider:
		w.provider(a.a, a.b, a.v == 1)
	case actWrite:
		pr := &s.procs[a.a]
		i := pr.head(a.b)
		e := pr.outbox[i]
		switch a.v {
		case opFails:
			w.fault()
			pr.healthy = s.now
		case opHangs:
			w.fault()
			pr.outbox[i].hung = true
			w.hang(hungOp{p: a.a, inc: pr.inc, op: e.op, key: e.key, owner: e.owner, out: e})
		default:
			v := w.write(e)
			w.note("%v", v)
			if a.v == opAckLost {
				w.fault()
				pr.healthy = s.now
				return
			}
			w.landed(a.a, i, v)
		}
	case actSettle:
		pr := &s.procs[a.a]
		o := s.newOwner(a.a)
		ev := s.settleEvent(b, a.a, a.b, o)
		switch a.v {
		case opFails:
			w.fault()
			pr.healthy = s.now
		case opHangs:
			w.fault()
			w.hang(hungOp{p: a.a, inc: pr.inc, op: opSettle, key: a.b, owner: o, settled: ev.Settled, pending: ev.Pending})
		default:
			_, eff := w.apply(a.b, ev, o)
			w.note("%v", eff.Verdict)
			if a.v == opAckLost {
				w.fault()
				pr.healthy = s.now
				w.push(a.a, entry{key: a.b, owner: o, op: opRelease, untracked: true, result: NothingSent})
				return
			}
			if eff.Verdict == Acquired {
				w.send(a.a, a.b, o)
			}
		}
	case actResolve:
		res := Resolve{To: NotCreated}
		if a.b == resolveFound {
			res = Resolve{To: Succeeded, Reply: replyBytes(found)}
		}
		w.apply(a.a, res, owner{})
	case actCrash:
		w.fault()
		pr := &s.procs[a.a]
		*pr = proc{inc: pr.inc + 1, healthy: s.now}
		for k := range s.callers {
			if c := &s.callers[k]; c.phase != idle && c.p == a.a {
				w.note("caller k%d's call is cut off", k)
				c.phase, c.owner = idle, owner{}
			}
		}
	case actHung:
		w.resolveHung(int(a.a), a.v == 0)
	case actReplicate:
		s.base, s.baseRows = s.store, s.rows
	case actRollback:
		w.fault()
		s.store, s.rows = s.base, s.baseRows
		for p := range s.procs {
			s.procs[p].healthy = s.now
		}
	}
}

func (w *world) fault() { w.s.faults++ }

func (w *world) hang(h hungOp) {
	h.used = true
	for i := range w.s.hung {
		if !w.s.hung[i].used {
			w.s.hung[i] = h
			w.note("hung op #%d", i)
			return
		}
	}
	panic("check: out of hung ops")
}

// claim is caller k's call (at its process) claiming the key, as variant
// v of the store operation.
func (w *world) claim(k, v int8) {
	s, b := w.s, w.b
	c := &s.callers[k]
	pr := &s.procs[c.p]
	o := s.newOwner(c.p)
	settled, pending := s.settled(b, c.p), s.factPending(b, c.p, k)
	switch v {
	case opFails:
		w.fault()
		pr.healthy = s.now
		w.answer(k, Tell(Call{Claim: ClaimFailed, Due: true}), 0)
	case opHangs:
		w.fault()
		c.phase, c.owner, c.sawMaybe = claimHung, o, sawMaybe(s.store[k])
		w.hang(hungOp{p: c.p, inc: c.inc, op: opClaim, key: k, owner: o, settled: settled, pending: pending, deadline: c.deadline})
	case opAckLost:
		w.fault()
		_, eff := w.apply(k, s.claimEvent(b, k, o, settled, pending, c.deadline), o)
		w.note("%v", eff.Verdict)
		pr.healthy = s.now
		w.push(c.p, entry{key: k, owner: o, op: opRelease, result: NothingSent})
		w.answer(k, Tell(Call{Claim: ClaimUnknown, Due: true}), 0)
	default:
		n, eff := w.apply(k, s.claimEvent(b, k, o, settled, pending, c.deadline), o)
		w.claimed(k, o, n, eff.Verdict)
	}
}

// claimed is caller k's call learning its claim's verdict.
func (w *world) claimed(k int8, o owner, n Record, v Verdict) {
	s := w.s
	c := &s.callers[k]
	w.note("claim %v", v)
	switch v {
	case Acquired:
		c.phase, c.owner, c.fresh = attached, o, n.Fresh()
		w.send(c.p, k, o)
	case Replay:
		if !w.answerFrom(k, s.store[k]) {
			panic("check: a replay that tells nothing")
		}
	case Busy:
		c.phase, c.owner = awaiting, owner{}
	case Quiet, PastWindow:
		w.answer(k, TellInProgress, 0)
	default:
		panic(fmt.Sprintf("check: claim verdict %v", v))
	}
}

// send is process p, holding o's claim of k, sending the key's request.
func (w *world) send(p, k int8, o owner) {
	s := w.s
	pr := &s.procs[p]
	if s.told[k].ok {
		w.violate("I1", "k%d sent to the provider after a caller was told OK", k)
	}
	pk := &s.prov[k]
	if pk.wrote2xx {
		w.res.resent2xx = true
	}
	for _, e := range pr.outbox {
		if e.used && e.key == k && e.result == Paid {
			w.res.ownPaid = true
		}
	}
	for _, q := range pk.reqs {
		if q.used {
			w.violate("I3", "k%d sent while another request for it is at the provider", k)
		}
	}
	placed := false
	for i := range pk.reqs {
		if !pk.reqs[i].used {
			pk.reqs[i] = req{used: true, owner: o, start: s.now}
			placed = true
			break
		}
	}
	if !placed {
		panic("check: out of provider requests")
	}
	for i := range pr.attempts {
		if !pr.attempts[i].used {
			pr.attempts[i] = attempt{used: true, key: k, owner: o, start: s.now, sendBy: s.store[k].leaseExp}
			w.note("p%d sends k%d", p+1, k)
			return
		}
	}
	panic("check: out of attempts")
}

// provider answers the first request at the provider for k.
func (w *world) provider(k, ans int8, lost bool) {
	s, b := w.s, w.b
	pk := &s.prov[k]
	q := pk.reqs[0]
	copy(pk.reqs[:], pk.reqs[1:])
	pk.reqs[len(pk.reqs)-1] = req{}
	var res Result
	var st code
	var reply int8
	switch {
	case ans == provRefuse:
		res, st = Refused, status401
	case !pk.created:
		pk.created, pk.wrote2xx = true, true
		res, st, reply = Paid, status200, 1
		if s.told[k].nc {
			w.violate("I2", "the provider created k%d after a caller was told NOT_CREATED", k)
		}
	case b.Mode == reuseFirst:
		res, st, reply = Paid, status200, 1
	default:
		res, st = Unknown, status409
	}
	w.note("%d", st.http())
	if lost {
		w.fault()
		return
	}
	p := q.owner.p - 1
	pr := &s.procs[p]
	if pr.inc != q.owner.inc {
		return
	}
	for i, at := range pr.attempts {
		if at.used && at.owner == q.owner {
			w.endAttempt(p, i, res, st, reply, 0)
			return
		}
	}
}

// endAttempt ends process p's attempt i with its result, which goes to the
// outbox and to its caller, if still attached.
func (w *world) endAttempt(p int8, i int, res Result, st code, reply, quietFor int8) {
	s := w.s
	at := s.procs[p].attempts[i]
	s.procs[p].attempts[i] = attempt{}
	w.push(p, entry{key: at.key, owner: at.owner, op: opFinish, result: res, status: st, reply: reply, sent: true, quietFor: quietFor})
	if c := &s.callers[at.key]; c.phase == attached && c.owner == at.owner {
		c.sent, c.result, c.reply = true, res, reply
	}
}

func (w *world) push(p int8, e entry) {
	e.used = true
	ob := &w.s.procs[p].outbox
	for i := range ob {
		if !ob[i].used {
			ob[i] = e
			return
		}
	}
	panic("check: out of outbox entries")
}

// landed: process p's outbox entry i landed with verdict v.
func (w *world) landed(p int8, i int, v Verdict) {
	s := w.s
	ob := &s.procs[p].outbox
	e := ob[i]
	copy(ob[i:], ob[i+1:])
	ob[len(ob)-1] = entry{}
	if c := &s.callers[e.key]; e.op == opFinish && c.phase == attached && c.owner == e.owner {
		c.landed = landedLost
		if v == Written || v == Late {
			c.landed = landedWritten
		}
		if v == Late && !w.b.Rules.LateOwnReply {
			// The engine reads the record back: a 2xx that landed late
			// may have found it Succeeded already, with another reply,
			// which it keeps.
			c.reply = s.store[e.key].reply
		}
	}
}

// resolveHung commits (or fails) hung op i.
func (w *world) resolveHung(i int, commit bool) {
	s, b := w.s, w.b
	h := s.hung[i]
	s.hung[i] = hungOp{}
	pr := &s.procs[h.p]
	alive := pr.inc == h.inc
	if alive {
		pr.healthy = s.now
	}
	entryAt := func() int {
		for j, e := range pr.outbox {
			if e.used && e.hung && e.owner == h.owner && e.op == h.op {
				return j
			}
		}
		return -1
	}
	if !commit {
		if !alive {
			return
		}
		switch h.op {
		case opClaim:
			if c := &s.callers[h.key]; c.phase == claimHung && c.owner == h.owner {
				w.answer(h.key, Tell(Call{Claim: ClaimFailed, Due: true}), 0)
			}
		case opFinish, opRelease:
			pr.outbox[entryAt()].hung = false
		}
		return
	}
	switch h.op {
	case opClaim:
		// The store finds Settled as the statement runs; the engine
		// brings Pending, found before it sent the claim.
		settled := h.settled
		if !b.Rules.IssuedFacts {
			settled = s.settled(b, h.p)
		}
		n, eff := w.apply(h.key, s.claimEvent(b, h.key, h.owner, settled, h.pending, h.deadline), h.owner)
		if !alive {
			w.note("%v", eff.Verdict)
			return
		}
		if c := &s.callers[h.key]; c.phase == claimHung && c.owner == h.owner {
			w.claimed(h.key, h.owner, n, eff.Verdict)
			return
		}
		w.note("%v; its caller left", eff.Verdict)
		if eff.Verdict == Acquired {
			w.push(h.p, entry{key: h.key, owner: h.owner, op: opFinish, result: NothingSent})
		}
	case opSettle:
		// The store finds both facts as the statement runs (SettleDue asks
		// the outbox in its transaction).
		ev := s.settleEvent(b, h.p, h.key, h.owner)
		if b.Rules.IssuedFacts {
			ev.Settled, ev.Pending = h.settled, h.pending
		}
		_, eff := w.apply(h.key, ev, h.owner)
		w.note("%v", eff.Verdict)
		if alive && eff.Verdict == Acquired {
			w.send(h.p, h.key, h.owner)
		}
	case opFinish, opRelease:
		v := w.write(h.out)
		w.note("%v", v)
		if alive {
			w.landed(h.p, entryAt(), v)
		}
	}
}

// answer tells caller k t (with reply for TellPaid).
func (w *world) answer(k int8, t Told, reply int8) {
	s := w.s
	c := &s.callers[k]
	w.note("caller k%d told %v", k, t)
	switch t {
	case TellPaid:
		w.toldOK(k, reply)
	case TellNotCreated:
		w.toldNotCreated(k)
	}
	c.phase, c.owner = idle, owner{}
}

// from is TellFrom, or the rule it replaced; for no record (a failover
// lost it), Wait: the call claims again, as the engine's wait does when
// the record is gone.
func (r rules) from(rec *Record) Told {
	if rec == nil {
		return Wait
	}
	if r.AnswerResolved && rec.State == NotCreated {
		return TellNotCreated
	}
	return TellFrom(rec)
}

// answerFrom answers caller k from record r, for a Replay or a Busy
// wait's end, and reports whether it did (otherwise the call claims
// again).
func (w *world) answerFrom(k int8, r mrec) bool {
	t := w.b.Rules.from(r.record(k))
	if t == Wait {
		return false
	}
	w.note("answered from the record (%v)", r.state)
	w.answer(k, t, r.reply)
	return true
}

func (w *world) toldOK(k, reply int8) {
	s := w.s
	if t := s.told[k]; t.ok && t.reply != reply {
		w.violate("I2", "callers of k%d told OK with two replies", k)
	}
	s.told[k].ok, s.told[k].reply = true, reply
	s.callers[k].done = true
}

func (w *world) toldNotCreated(k int8) {
	s := w.s
	s.told[k].nc = true
	s.callers[k].done = true
	if s.prov[k].created {
		w.violate("I2", "a caller of k%d told NOT_CREATED, and the provider created it", k)
	}
}

// tell is record.Tell, or the rule it replaced.
func (r rules) tell(c Call) Told {
	if r.OKAtDeadline && c.Claim == ClaimAcquired && c.Sent && c.Result == Paid && c.Due {
		return TellPaid
	}
	return Tell(c)
}

// answerCalls answers every call that has something to tell, or whose
// deadline has come.
func (w *world) answerCalls() {
	s := w.s
	for k := range s.callers {
		c := &s.callers[k]
		due := s.now >= c.deadline
		switch c.phase {
		case claimHung:
			if due {
				w.answer(int8(k), Tell(Call{Claim: ClaimRunning, SawMaybe: c.sawMaybe, Due: true}), 0)
			}
		case awaiting:
			if due {
				w.answer(int8(k), TellInProgress, 0)
			}
		case attached:
			call := Call{Claim: ClaimAcquired, Fresh: c.fresh, Sent: c.sent, Result: c.result,
				Written: c.landed == landedWritten, Lost: c.landed == landedLost, Due: due}
			if t := w.b.Rules.tell(call); t != Wait {
				w.answer(int8(k), t, c.reply)
			}
		}
	}
}

// checkRecords checks what the committed records say against what callers
// were told.
func (w *world) checkRecords() {
	s := w.s
	for k := range s.told {
		t, r := s.told[k], s.store[k]
		if t.ok && r.state == Succeeded && r.reply != t.reply {
			w.violate("I2", "k%d's record is SUCCEEDED with another reply than its caller was told", k)
		}
	}
}

// next sets n to the state after a in s, and returns what came of it.
func (s *state) next(n *state, b *bound, a act, verbose bool) result {
	*n = *s
	w := &world{s: n, b: b, verbose: verbose}
	w.step(a)
	w.answerCalls()
	w.checkRecords()
	n.gcRows()
	return w.res
}

// doomed checks a state in which nothing more can happen: a caller told
// OK must find the key's record SUCCEEDED.
func (s *state) doomed() (invariant, string) {
	for k := range s.told {
		if s.told[k].ok && s.store[k].state != Succeeded {
			return "I2", fmt.Sprintf("a caller of k%d was told OK and its record ends %v", k, s.store[k].state)
		}
	}
	return "", ""
}
