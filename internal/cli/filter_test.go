package cli

import (
	"testing"
	"time"
)

// TestParseTime: the days a person types are UTC days, and a day as the
// end of a range includes it.
func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 24, 2, 58, 0, 0, time.UTC)
	tests := []struct {
		in   string
		end  bool
		want time.Time
	}{
		{"yesterday", false, time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)},
		{"yesterday", true, time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)},
		{"today", false, time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)},
		{"2026-02-28", true, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{"2026-11-23", false, time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)},
		{"2026-11-23T09:30:00+01:00", true, time.Date(2026, 11, 23, 8, 30, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		got, err := parseTime("--from", tt.in, now, tt.end)
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("parseTime(%q, end %v) = %v, %v; want %v", tt.in, tt.end, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "23/11/2026", "2026-11-23 09:00", "tomorrow"} {
		if _, err := parseTime("--from", bad, now, false); ExitCode(err) != ExitUsage {
			t.Errorf("parseTime(%q) = %v, want a usage error", bad, err)
		}
	}
}
