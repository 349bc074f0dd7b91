package simulator_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTestKeys: each test key answers its first and its later requests as
// documented, and makes a payment only where it says it does.
func TestTestKeys(t *testing.T) {
	t.Parallel()
	// first and second are the requests' statuses; 0: no answer came.
	tests := []struct {
		key           string
		first, second int
		created       int
	}{
		{"sim-decline-1", http.StatusBadRequest, http.StatusBadRequest, 0},
		{"sim-status-503-1", http.StatusServiceUnavailable, http.StatusServiceUnavailable, 0},
		{"sim-status-429-x", http.StatusTooManyRequests, http.StatusTooManyRequests, 0},
		{"sim-status-200-1", http.StatusBadRequest, http.StatusBadRequest, 0},
		{"sim-status-5031", http.StatusBadRequest, http.StatusBadRequest, 0},
		{"sim-slow-1", http.StatusOK, http.StatusOK, 1},
		{"sim-hang-1", 0, http.StatusOK, 1},
		{"sim-reset-1", 0, http.StatusOK, 1},
		{"sim-lost-1", 0, http.StatusOK, 1},
		{"sim-in-doubt-1", http.StatusConflict, http.StatusConflict, 0},
		{"order-1", http.StatusOK, http.StatusOK, 1},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Idempotent(true)
			srv.SetScript(srv.TestKeys())
			// A client that gives up, so that a held answer ends.
			client := srv.Client()
			client.Timeout = 2 * time.Second
			body := strings.Replace(goodBody, "idem-1", tt.key, 1)
			var got [2]int
			var replies [2][]byte
			for i := range got {
				r, err := do(t, client, srv.URL, call{key: goodKey, body: body})
				if err == nil {
					got[i], replies[i] = r.status, r.body
				}
			}
			if got != [2]int{tt.first, tt.second} || srv.Created() != tt.created {
				t.Errorf("two requests with key %s: %v (created %d), want %v (created %d); replies %q", tt.key, got, srv.Created(), [2]int{tt.first, tt.second}, tt.created, replies)
			}
			if tt.second == http.StatusOK && decode(t, replies[1])["id"] != "pay_sim_1" {
				t.Errorf("second request with key %s: %s, want the one payment, pay_sim_1", tt.key, replies[1])
			}
		})
	}
}
