package main

import (
	"sync"
	"time"
)

// testClock is a clock a test moves forward, as if time passed: what waits
// on it (service.Clock.AfterFunc) is called once the test moves it past
// the time waited for, or once the host's clock gets there.
type testClock struct {
	mu     sync.Mutex
	offset time.Duration
	waits  map[*clockWait]bool
}

type clockWait struct {
	at   time.Time
	once sync.Once
	f    func()
	real *time.Timer
}

func newTestClock() *testClock { return &testClock{waits: map[*clockWait]bool{}} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *testClock) AfterFunc(at time.Time, f func()) (stop func() bool) {
	w := &clockWait{at: at, f: f}
	c.mu.Lock()
	c.waits[w] = true
	w.real = time.AfterFunc(at.Sub(time.Now().Add(c.offset)), func() { c.fire(w) })
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.real.Stop()
		pending := c.waits[w]
		delete(c.waits, w)
		return pending
	}
}

func (c *testClock) fire(w *clockWait) {
	c.mu.Lock()
	pending := c.waits[w]
	delete(c.waits, w)
	c.mu.Unlock()
	if pending {
		w.once.Do(w.f)
	}
}

// advance moves the clock forward by d, and calls what waited for a time
// it has now reached.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	now := time.Now().Add(c.offset)
	var due []*clockWait
	for w := range c.waits {
		if !now.Before(w.at) {
			due = append(due, w)
		}
	}
	c.mu.Unlock()
	for _, w := range due {
		go c.fire(w)
	}
}
