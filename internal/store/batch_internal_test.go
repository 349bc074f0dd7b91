package store

import (
	"context"
	"errors"
	"testing"
)

// TestDetachableResult: a detachable operation whose result is in when
// its caller's ctx ends gives its caller the result (late is not called);
// one whose result comes after its caller detached gives it to late, once.
func TestDetachableResult(t *testing.T) {
	t.Parallel()
	b := &batcher{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errDone := errors.New("done")

	// The caller's select finds both its result and its ctx's end, and
	// picks either at random: each way, it gets the result.
	for range 64 {
		lates := 0
		op := &batchOp{errc: make(chan error, 1), late: func(error) { lates++ }}
		op.state.Store(opTaken)
		op.finish(errDone)
		if err, state := b.await(ctx, op); !errors.Is(err, errDone) || state != opDone || lates != 0 {
			t.Fatalf("await() with the result in = %v, state %d, %d late calls; want the result, done, none", err, state, lates)
		}
	}

	var got []error
	op := &batchOp{errc: make(chan error, 1), late: func(err error) { got = append(got, err) }}
	op.state.Store(opTaken)
	if err, state := b.await(ctx, op); !errors.Is(err, context.Canceled) || state != opDetached {
		t.Errorf("await() with no result = %v, state %d; want ctx's error, detached", err, state)
	}
	op.finish(errDone)
	if len(got) != 1 || !errors.Is(got[0], errDone) {
		t.Errorf("late got %v, want the result once", got)
	}
}
