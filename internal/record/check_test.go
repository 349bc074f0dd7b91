package record

import (
	"testing"
	"unsafe"
)

func TestCheckStateHasNoPadding(t *testing.T) {
	if a := unsafe.Alignof(state{}); a != 1 {
		t.Fatalf("state's alignment = %d, want 1 (one-byte fields only, so that it hashes as its bytes)", a)
	}
}

func TestCheckSmoke(t *testing.T) {
	b := Bound{Replicas: 2, Keys: 1, Calls: 3, Faults: 2, Time: 5, Depth: 14,
		Times: times{Lease: 2, Quiet: 2, Grace: 1, Deadline: 1, SettleAfter: 0, Window: 100}}
	rep := explore(&b, false)
	t.Log(rep)
	for _, f := range rep.findings {
		t.Logf("%s: %s\n%s", f.violation, f.why, describe(&b, f.schedule))
	}
	if rep.resentExample != nil {
		t.Logf("resent:\n%s", describe(&b, rep.resentExample))
	}
	t.Log(unsafe.Sizeof(state{}))
}
