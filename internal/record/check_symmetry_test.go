package record

import "slices"

// Symmetry. Two states that differ only in which process is which, or
// which key is which, or in the order of tables whose order means nothing
// (attempts, hung operations, the outbox across keys), behave alike: the
// search visits one of them. Only fingerprints are canonical; the states
// searched are the ones the schedules reach.

// canonical is the fingerprint of s's class: the least over the
// relabellings of processes and keys the bound allows.
func canonical(b *Bound, s *state) [2]uint64 {
	fp := func(n state) [2]uint64 {
		n.normalize()
		return fingerprint(&n)
	}
	best := fp(*s)
	try := func(n state) {
		if f := fp(n); f[0] < best[0] || f[0] == best[0] && f[1] < best[1] {
			best = f
		}
	}
	if b.Replicas == 2 {
		try(s.swapProcs())
	}
	if b.Keys == 2 {
		k := s.swapKeys()
		try(k)
		if b.Replicas == 2 {
			try(k.swapProcs())
		}
	}
	return best
}

// normalize sorts the tables whose order means nothing.
func (s *state) normalize() {
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

// swapProcs is s with processes 1 and 2 exchanged.
func (s *state) swapProcs() state {
	n := *s
	n.procs[0], n.procs[1] = s.procs[1], s.procs[0]
	sw := func(o *owner) {
		if o.p != 0 {
			o.p = 3 - o.p
		}
	}
	n.eachOwner(sw)
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
	return n
}

// swapKeys is s with keys 0 and 1 exchanged.
func (s *state) swapKeys() state {
	n := *s
	n.store[0], n.store[1] = s.store[1], s.store[0]
	n.base[0], n.base[1] = s.base[1], s.base[0]
	n.prov[0], n.prov[1] = s.prov[1], s.prov[0]
	n.callers[0], n.callers[1] = s.callers[1], s.callers[0]
	n.told[0], n.told[1] = s.told[1], s.told[0]
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
	return n
}

// eachOwner calls f on every owner field of s.
func (s *state) eachOwner(f func(*owner)) {
	for i := range s.store {
		f(&s.store[i].owner)
		f(&s.base[i].owner)
	}
	for i := range s.rows {
		f(&s.rows[i].owner)
		f(&s.baseRows[i].owner)
	}
	for i := range s.hung {
		f(&s.hung[i].owner)
		f(&s.hung[i].out.owner)
	}
	for p := range s.procs {
		for i := range s.procs[p].attempts {
			f(&s.procs[p].attempts[i].owner)
		}
		for i := range s.procs[p].outbox {
			f(&s.procs[p].outbox[i].owner)
		}
	}
	for k := range s.prov {
		for i := range s.prov[k].reqs {
			f(&s.prov[k].reqs[i].owner)
		}
	}
	for i := range s.callers {
		f(&s.callers[i].owner)
	}
}
