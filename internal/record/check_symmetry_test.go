package record

import "slices"

// Symmetry. Two states that differ only in which process is which, or
// which key is which, in the order of tables whose order means nothing
// (attempts, hung operations, the outbox across keys), or in when they
// happen (every time read relative to now, and a time that matters only
// once passed forgotten once it has), behave alike: the search visits one
// of them. Only fingerprints are canonical; the states searched are the
// ones the schedules reach. Shifting time is sound only with no time bound
// (bound.Time 0), and a settlement window that outlasts every schedule.

// budget is what a state has spent of what only enables steps: faults,
// and each key's calls. A state that has spent less can do all the same
// steps and more, so the search skips a state it has seen with as little
// spent or less (at no greater depth: it searches breadth first).
type budget struct{ faults, calls0, calls1 int8 }

// index is b's number among budgets, for the sets of them a state is
// seen with.
func (b budget) index() int { return int(b.faults)<<4 | int(b.calls0)<<2 | int(b.calls1) }

func (b budget) less(c budget) bool {
	return b.faults < c.faults || b.faults == c.faults && (b.calls0 < c.calls0 || b.calls0 == c.calls0 && b.calls1 < c.calls1)
}

// budgets is a set of budgets: bit index().
type budgets [2]uint64

// below is, for each budget, the set of budgets that spent no more.
var below = func() (m [128]budgets) {
	for i := range 128 {
		for j := range 128 {
			if j>>4 <= i>>4 && j>>2&3 <= i>>2&3 && j&3 <= i&3 {
				m[i][j/64] |= 1 << (j % 64)
			}
		}
	}
	return m
}()

// covers reports whether set holds a budget that spent no more than b.
func (set budgets) covers(b budget) bool {
	m := below[b.index()]
	return set[0]&m[0] != 0 || set[1]&m[1] != 0
}

func (set *budgets) add(b budget) {
	i := b.index()
	set[i/64] |= 1 << (i % 64)
}

// canonizer computes canonical fingerprints in states of its own, which
// it reuses.
type canonizer struct{ n state }

// of is the fingerprint of s's class, what it has spent aside: the least
// over the relabellings of processes and keys the bound allows; and what
// it has spent, as that relabelling has it.
func (c *canonizer) of(b *bound, s *state) ([2]uint64, budget) {
	if s.faults > 7 || s.callers[0].calls > 3 || s.callers[1].calls > 3 {
		panic("check: a budget past what the search keeps (7 faults, 3 calls a key)")
	}
	var best [2]uint64
	var spent budget
	for i, swap := range [...]struct{ procs, keys bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		if swap.procs && b.Replicas != 2 || swap.keys && b.Keys != 2 {
			continue
		}
		n := &c.n
		*n = *s
		if swap.keys {
			n.swapKeys()
		}
		if swap.procs {
			n.swapProcs()
		}
		n.normalize(b)
		sp := budget{n.faults, n.callers[0].calls, n.callers[1].calls}
		n.faults, n.callers[0].calls, n.callers[1].calls = 0, 0, 0
		f := fingerprint(n)
		if i == 0 || f[0] < best[0] || f[0] == best[0] && (f[1] < best[1] || f[1] == best[1] && sp.less(spent)) {
			best, spent = f, sp
		}
	}
	return best, spent
}

// normalize sorts the tables whose order means nothing, forgets what
// no step reads, and, with no time bound, shifts time so that now is 0.
func (s *state) normalize(b *bound) {
	if b.Time == 0 {
		s.shiftTime(b)
	}
	for i := range s.callers {
		if c := &s.callers[i]; c.phase == idle {
			*c = caller{calls: c.calls, done: c.done}
		}
	}
	for p := range s.procs {
		pr := &s.procs[p]
		slices.SortFunc(pr.attempts[:], func(x, y attempt) int { return cmpAttempt(x, y) })
		// The outbox writes each key's entries in order; across keys
		// order means nothing.
		slices.SortStableFunc(pr.outbox[:], func(x, y entry) int { return cmpKeyUsed(x.used, x.key, y.used, y.key) })
	}
	slices.SortFunc(s.hung[:], func(x, y hungOp) int { return cmpHung(x, y) })
	sortRows(&s.rows)
	sortRows(&s.baseRows)
	s.relabel()
}

// relabel renames incarnations and claims in order of first appearance:
// a process's live incarnation is 0, and what matters of owners is only
// which are the same.
func (s *state) relabel() {
	var incs [maxProcs][8]int8
	var ids [maxProcs][8][16]int8
	var nextInc [maxProcs]int8
	var nextID [maxProcs][8]int8
	for p := range incs {
		for i := range incs[p] {
			incs[p][i] = -1
			for c := range ids[p][i] {
				ids[p][i][c] = -1
			}
		}
		incs[p][s.procs[p].inc] = 0
		nextInc[p] = 1
	}
	inc := func(p, i int8) int8 {
		if incs[p][i] < 0 {
			incs[p][i] = nextInc[p]
			nextInc[p]++
		}
		return incs[p][i]
	}
	f := func(o *owner) {
		if o.p == 0 {
			return
		}
		p := o.p - 1
		l := inc(p, o.inc)
		if ids[p][l][o.c] < 0 {
			ids[p][l][o.c] = nextID[p][l]
			nextID[p][l]++
		}
		o.inc, o.c = l, ids[p][l][o.c]
	}
	for i := range s.callers {
		f(&s.callers[i].owner)
	}
	for i := range s.store {
		f(&s.store[i].owner)
	}
	for i := range s.procs {
		for j := range s.procs[i].attempts {
			f(&s.procs[i].attempts[j].owner)
		}
		for j := range s.procs[i].outbox {
			f(&s.procs[i].outbox[j].owner)
		}
	}
	for i := range s.hung {
		f(&s.hung[i].owner)
		f(&s.hung[i].out.owner)
	}
	for i := range s.prov {
		for j := range s.prov[i].reqs {
			f(&s.prov[i].reqs[j].owner)
		}
	}
	for i := range s.base {
		f(&s.base[i].owner)
	}
	for i := range s.rows {
		f(&s.rows[i].owner)
		f(&s.baseRows[i].owner)
	}
	for i := range s.hung {
		if s.hung[i].used {
			s.hung[i].inc = inc(s.hung[i].p, s.hung[i].inc)
		}
	}
	for i := range s.callers {
		if s.callers[i].phase != idle {
			s.callers[i].inc = inc(s.callers[i].p, s.callers[i].inc)
		}
	}
	for p := range s.procs {
		s.procs[p].inc = 0
	}
}

func cmpKeyUsed(xu bool, xk int8, yu bool, yk int8) int {
	switch {
	case xu != yu:
		if xu {
			return -1
		}
		return 1
	case xk != yk:
		return int(xk) - int(yk)
	}
	return 0
}

func cmpOwner(x, y owner) int {
	switch {
	case x.p != y.p:
		return int(x.p) - int(y.p)
	case x.inc != y.inc:
		return int(x.inc) - int(y.inc)
	}
	return int(x.c) - int(y.c)
}

func cmpAttempt(x, y attempt) int {
	if c := cmpKeyUsed(x.used, x.key, y.used, y.key); c != 0 {
		return c
	}
	if c := cmpOwner(x.owner, y.owner); c != 0 {
		return c
	}
	return int(x.start) - int(y.start)
}

func cmpHung(x, y hungOp) int {
	if c := cmpKeyUsed(x.used, x.key, y.used, y.key); c != 0 {
		return c
	}
	if x.op != y.op {
		return int(x.op) - int(y.op)
	}
	return cmpOwner(x.owner, y.owner)
}

func sortRows(rows *[maxRows]row) {
	slices.SortFunc(rows[:], func(x, y row) int {
		if c := cmpKeyUsed(x.used, x.key, y.used, y.key); c != 0 {
			return c
		}
		return cmpOwner(x.owner, y.owner)
	})
}

// swapProcs exchanges processes 1 and 2 in s.
func (n *state) swapProcs() {
	n.procs[0], n.procs[1] = n.procs[1], n.procs[0]
	n.swapOwnerProcs()
	for i := range n.hung {
		if n.hung[i].used {
			n.hung[i].p = 1 - n.hung[i].p
		}
	}
	for i := range n.callers {
		if n.callers[i].phase != idle {
			n.callers[i].p = 1 - n.callers[i].p
		}
	}
}

func (o *owner) swapProc() {
	if o.p != 0 {
		o.p = 3 - o.p
	}
}

// swapKeys exchanges keys 0 and 1 in s.
func (n *state) swapKeys() {
	n.store[0], n.store[1] = n.store[1], n.store[0]
	n.base[0], n.base[1] = n.base[1], n.base[0]
	n.prov[0], n.prov[1] = n.prov[1], n.prov[0]
	n.callers[0], n.callers[1] = n.callers[1], n.callers[0]
	n.told[0], n.told[1] = n.told[1], n.told[0]
	sw := func(k *int8) { *k = 1 - *k }
	for i := range n.rows {
		if n.rows[i].used {
			sw(&n.rows[i].key)
		}
		if n.baseRows[i].used {
			sw(&n.baseRows[i].key)
		}
	}
	for i := range n.hung {
		if n.hung[i].used {
			sw(&n.hung[i].key)
			sw(&n.hung[i].out.key)
		}
	}
	for p := range n.procs {
		for i := range n.procs[p].attempts {
			if n.procs[p].attempts[i].used {
				sw(&n.procs[p].attempts[i].key)
			}
		}
		for i := range n.procs[p].outbox {
			if n.procs[p].outbox[i].used {
				sw(&n.procs[p].outbox[i].key)
			}
		}
	}
}

// swapOwnerProcs exchanges processes 1 and 2 in every owner in s.
func (s *state) swapOwnerProcs() {
	for i := range s.store {
		s.store[i].owner.swapProc()
		s.base[i].owner.swapProc()
	}
	for i := range s.rows {
		s.rows[i].owner.swapProc()
		s.baseRows[i].owner.swapProc()
	}
	for i := range s.hung {
		s.hung[i].owner.swapProc()
		s.hung[i].out.owner.swapProc()
	}
	for p := range s.procs {
		for i := range s.procs[p].attempts {
			s.procs[p].attempts[i].owner.swapProc()
		}
		for i := range s.procs[p].outbox {
			s.procs[p].outbox[i].owner.swapProc()
		}
	}
	for k := range s.prov {
		for i := range s.prov[k].reqs {
			s.prov[k].reqs[i].owner.swapProc()
		}
	}
	for i := range s.callers {
		s.callers[i].owner.swapProc()
	}
}

// shiftTime makes every time in s relative to now (which becomes 0), and
// forgets the times that matter only until they pass once they have.
func (s *state) shiftTime(b *bound) {
	now := s.now
	s.now = 0
	// passed: a time read only as "has it come?" (Before(t), or t <= now).
	passed := func(t *tick) {
		if *t == never || *t <= now {
			*t = never
		} else {
			*t -= now
		}
	}
	// floor: a time read as how long ago, up to d.
	floor := func(t *tick, d int) {
		*t = tick(max(int(*t)-int(now), -d))
	}
	recs := func(r *mrec) {
		passed(&r.leaseExp)
		passed(&r.quietUntil)
		passed(&r.nextSettle)
		if b.Times.Window <= b.Depth {
			passed(&r.settleBy)
		} else {
			r.settleBy = never
		}
		// Resolved() is read only of a NotCreated record.
		resolved := r.state == NotCreated && r.resolvedAt != never && r.attemptAt <= r.resolvedAt
		r.resolvedAt, r.attemptAt = never, never
		if resolved {
			r.resolvedAt = 0
		}
	}
	for i := range s.store {
		recs(&s.store[i])
		recs(&s.base[i])
	}
	for i := range s.hung {
		if h := &s.hung[i]; h.used && h.op == opClaim {
			passed(&h.deadline)
		}
	}
	for p := range s.procs {
		pr := &s.procs[p]
		floor(&pr.healthy, b.Times.Grace)
		for i := range pr.attempts {
			if a := &pr.attempts[i]; a.used {
				floor(&a.start, b.Times.Quiet)
				a.sendBy -= now
			}
		}
	}
	for k := range s.prov {
		for i := range s.prov[k].reqs {
			if q := &s.prov[k].reqs[i]; q.used {
				floor(&q.start, b.Times.Quiet)
			}
		}
	}
	for i := range s.callers {
		if c := &s.callers[i]; c.phase != idle {
			c.deadline -= now
		}
	}
}
