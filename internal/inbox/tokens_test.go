package inbox_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestSetTokens: tokens swapped while serving take effect for the next
// delivery; a token removed is refused but still redacted; a refused set
// changes nothing.
func TestSetTokens(t *testing.T) {
	t.Parallel()
	in := startIntake(t, oldToken)
	post := func(tok string, header http.Header) int {
		t.Helper()
		status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+tok, strings.NewReader(`{}`), header)
		return status
	}
	if got := post(token, nil); got != http.StatusNotFound {
		t.Fatalf("new token before SetTokens = %d, want 404", got)
	}
	if err := in.handler.SetTokens([]string{oldToken, token}); err != nil {
		t.Fatal(err)
	}
	if got, got2 := post(oldToken, nil), post(token, nil); got != http.StatusOK || got2 != http.StatusOK {
		t.Fatalf("with both tokens: old %d, new %d; want 200, 200", got, got2)
	}
	for _, bad := range [][]string{nil, {token, token}, {"short"}, {token, oldToken, token + "x"}} {
		if err := in.handler.SetTokens(bad); err == nil {
			t.Errorf("SetTokens(%d tokens) succeeded, want an error", len(bad))
		} else if strings.Contains(err.Error(), token) {
			t.Errorf("SetTokens error quotes a token: %v", err)
		}
	}
	if err := in.handler.SetTokens([]string{token}); err != nil {
		t.Fatal(err)
	}
	if got := post(oldToken, nil); got != http.StatusNotFound {
		t.Errorf("old token after its removal = %d, want 404", got)
	}
	if got := post(token, http.Header{"X-Original-Uri": {"/webhooks/" + oldToken}}); got != http.StatusOK {
		t.Fatalf("new token = %d, want 200", got)
	}
	evs := in.events(t)
	last := evs[len(evs)-1]
	for _, h := range last.Headers {
		if strings.Contains(h.Value, oldToken) || strings.Contains(h.Value, token) {
			t.Errorf("stored header %s holds a token: %q", h.Name, h.Value)
		}
	}
	if strings.Contains(in.logs.String(), oldToken) || strings.Contains(in.logs.String(), token) {
		t.Errorf("logs hold a token")
	}
}
