package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	ten := make([]time.Duration, 10) // 1 ms to 10 ms
	for i := range ten {
		ten[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"none", nil, 50, 0},
		{"one, p50", []time.Duration{7}, 50, 7},
		{"one, p100", []time.Duration{7}, 100, 7},
		{"ten, p0: the least", ten, 0, time.Millisecond},
		{"ten, p10: the first rank", ten, 10, time.Millisecond},
		{"ten, p11: the next rank up", ten, 11, 2 * time.Millisecond},
		{"ten, p50: nearest rank, not the mean of 5 and 6", ten, 50, 5 * time.Millisecond},
		{"ten, p99", ten, 99, 10 * time.Millisecond},
		{"ten, p100: the most", ten, 100, 10 * time.Millisecond},
		{"two, p50", []time.Duration{1, 9}, 50, 1},
		{"two, p51", []time.Duration{1, 9}, 51, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}
