package record

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"time"
	"unsafe"
)

// The explorer: a breadth-first search of every schedule up to the bound,
// which visits each state once (by a 128-bit fingerprint of its bytes) and
// so finds the shortest schedule to each violation.

// node is a visited state's place in the search tree: its parent and the
// step that led to it.
type node struct {
	parent *node
	a      act
}

// nodes allocates nodes in blocks.
type nodes struct{ block []node }

func (ns *nodes) add(parent *node, a act) *node {
	if len(ns.block) == cap(ns.block) {
		ns.block = make([]node, 0, 1<<14)
	}
	ns.block = append(ns.block, node{parent: parent, a: a})
	return &ns.block[len(ns.block)-1]
}

func (n *node) schedule() []act {
	var s []act
	for ; n != nil && n.parent != nil; n = n.parent {
		s = append(s, n.a)
	}
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}

// finding is a schedule that broke an invariant.
type finding struct {
	violation invariant
	why       string
	schedule  []act
}

// report is what an exploration found.
type report struct {
	states, transitions int
	// depth is the deepest level explored; complete, that every schedule
	// ended before the depth bound.
	depth    int
	complete bool
	// violations counts the transitions that broke an invariant; findings
	// keeps the first few, shortest first.
	violations int
	findings   []finding
	// resent counts the transitions that sent a key again after the
	// provider wrote a 2xx for it, and resentExample is the first.
	resent        int
	resentExample []act
	// ownPaid counts the transitions that sent a key whose 2xx the
	// sender's own outbox held, and ownPaidExample is the first.
	ownPaid        int
	ownPaidExample []act
	elapsed        time.Duration
	// heap is the most heap in use at the start of a level.
	heap uint64
}

func (r report) String() string {
	return fmt.Sprintf("%d states, %d transitions, depth %d (complete: %v), %d violations, %d sends after a provider-written 2xx (%d while the sender's outbox held it), in %v, heap %d MiB",
		r.states, r.transitions, r.depth, r.complete, r.violations, r.resent, r.ownPaid, r.elapsed.Round(time.Millisecond), r.heap>>20)
}

const keepFindings = 5

// found notes f, and reports whether the search stops at it: then f is
// the only finding kept.
func (r *report) found(f finding, stop func(finding) bool) bool {
	r.violations++
	if stop != nil && stop(f) {
		r.findings = []finding{f}
		return true
	}
	if len(r.findings) < keepFindings {
		r.findings = append(r.findings, f)
	}
	return false
}

// fingerprint is the first 128 bits of the SHA-256 of s's bytes: state
// is made of one-byte fields only, so it has no padding, and equal states
// have equal bytes. (SHA-256 rather than a hash written here: it is
// assembly, which the race detector does not slow down.)
func fingerprint(s *state) [2]uint64 {
	sum := sha256.Sum256(unsafe.Slice((*byte)(unsafe.Pointer(s)), unsafe.Sizeof(*s)))
	return [2]uint64{binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])}
}

// explore searches every schedule of b, breadth first; if stop is not
// nil, only until a finding it says to stop at.
func explore(b *bound, stop func(finding) bool) report {
	start := time.Now()
	var rep report
	var ns nodes
	type item struct {
		s state
		n *node
	}
	s0 := initial(b)
	seen := map[[2]uint64]budgets{}
	var c canonizer
	fp0, spent0 := c.of(b, &s0)
	set0 := seen[fp0]
	set0.add(spent0)
	seen[fp0] = set0
	// A level is kept in blocks, so that it grows without copying.
	const block = 1 << 12
	frontier := [][]item{{{s: s0, n: ns.add(nil, act{})}}}
	rep.states = 1
	var ms runtime.MemStats
	var as []act
	var n state
	for depth := 0; len(frontier) > 0; depth++ {
		rep.depth = depth
		runtime.ReadMemStats(&ms)
		rep.heap = max(rep.heap, ms.HeapInuse)
		if depth == b.Depth {
			break
		}
		var next [][]item
		for j, i := 0, 0; j < len(frontier); i++ {
			if i == len(frontier[j]) {
				frontier[j] = nil
				j, i = j+1, -1
				continue
			}
			it := &frontier[j][i]
			as = it.s.actions(b, as)
			if len(as) == 0 {
				if v, why := it.s.doomed(); v != "" {
					if rep.found(finding{violation: v, why: why, schedule: it.n.schedule()}, stop) {
						rep.elapsed = time.Since(start)
						return rep
					}
				}
				continue
			}
			for _, a := range as {
				res := it.s.next(&n, b, a, false)
				rep.transitions++
				if res.resent2xx {
					rep.resent++
					if rep.resentExample == nil {
						rep.resentExample = append(it.n.schedule(), a)
					}
				}
				if res.ownPaid {
					rep.ownPaid++
					if rep.ownPaidExample == nil {
						rep.ownPaidExample = append(it.n.schedule(), a)
					}
				}
				if res.violation != "" {
					if rep.found(finding{violation: res.violation, why: res.why, schedule: append(it.n.schedule(), a)}, stop) {
						rep.elapsed = time.Since(start)
						return rep
					}
					continue
				}
				fp, spent := c.of(b, &n)
				set := seen[fp]
				if set.covers(spent) {
					continue
				}
				set.add(spent)
				seen[fp] = set
				rep.states++
				if len(next) == 0 || len(next[len(next)-1]) == block {
					next = append(next, make([]item, 0, block))
				}
				last := &next[len(next)-1]
				*last = append(*last, item{s: n, n: ns.add(it.n, a)})
			}
		}
		frontier = next
	}
	rep.complete = len(frontier) == 0
	rep.elapsed = time.Since(start)
	return rep
}

// describe replays schedule and writes it out, a step a line, with what
// each step did.
func describe(b *bound, schedule []act) string {
	var sb strings.Builder
	s := initial(b)
	var n state
	for i, a := range schedule {
		res := s.next(&n, b, a, true)
		fmt.Fprintf(&sb, "%3d. t=%d  %-52s  %s", i+1, s.now, fmt.Sprintf("%q,", a.String()), strings.Join(res.notes, "; "))
		if res.violation != "" {
			fmt.Fprintf(&sb, "  *** %s: %s", res.violation, res.why)
		}
		sb.WriteByte('\n')
		s = n
	}
	if v, why := s.doomed(); v != "" && len(s.actions(b, nil)) == 0 {
		fmt.Fprintf(&sb, "     nothing more can happen  *** %s: %s\n", v, why)
	}
	return sb.String()
}

// replay runs the schedule given as the steps' names (as describe writes
// them) and returns the first invariant it breaks, and at which step
// (1-based; past the end: when nothing more can happen).
func replay(b *bound, steps []string) (invariant, int, error) {
	s := initial(b)
	for i, name := range steps {
		found := false
		for _, a := range s.actions(b, nil) {
			if a.String() != name {
				continue
			}
			var n state
			res := s.next(&n, b, a, false)
			if res.violation != "" {
				return res.violation, i + 1, nil
			}
			s, found = n, true
			break
		}
		if !found {
			return "", i + 1, fmt.Errorf("step %d, %q, is not possible then", i+1, name)
		}
	}
	if len(s.actions(b, nil)) == 0 {
		if v, _ := s.doomed(); v != "" {
			return v, len(steps) + 1, nil
		}
	}
	return "", 0, nil
}

func names(schedule []act) []string {
	var s []string
	for _, a := range schedule {
		s = append(s, a.String())
	}
	return s
}
