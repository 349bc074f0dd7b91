package cli

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestExportTimeAsTheAPIWritesIt: an export writes an instant as a lookup
// does (protojson), trailing zeros of its fraction included.
func TestExportTimeAsTheAPIWritesIt(t *testing.T) {
	for _, nanos := range []int{0, 100_000_000, 804_090_000, 804_090_001, 1_000, 999_999_999} {
		ts := timestamppb.New(time.Date(2026, 11, 26, 7, 0, 0, nanos, time.UTC))
		b, err := protojson.Marshal(ts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := exportTime(ts), strings.Trim(string(b), `"`); got != want {
			t.Errorf("exportTime(%d ns) = %q, want %q as the API writes it", nanos, got, want)
		}
	}
}
