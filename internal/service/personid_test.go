package service_test

import (
	"testing"

	"example.com/paymentsd/internal/service"
)

// TestPersonID: a person's identity is built from any Kubernetes user name
// of printable ASCII, exactly: each byte outside A-Z a-z 0-9 . - becomes _
// and its two lower-case hex digits, so that no two user names share an
// identity (case is kept: Kubernetes' user names are case-sensitive); and
// PAYMENTS_ADMIN_CALLERS' parser takes what it builds and refuses any other
// spelling of a person's name, which no certificate would ever carry.
func TestPersonID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		user, want string
	}{
		{"alice", "spiffe://corp.example/ns/payments-live/people/alice"},
		{"Alice", "spiffe://corp.example/ns/payments-live/people/Alice"},
		{"alice@corp.example", "spiffe://corp.example/ns/payments-live/people/alice_40corp.example"},
		{"oidc:alice", "spiffe://corp.example/ns/payments-live/people/oidc_3aalice"},
		{"oidc:Alice.Smith@Corp.Example", "spiffe://corp.example/ns/payments-live/people/oidc_3aAlice.Smith_40Corp.Example"},
		{"system:serviceaccount:ops:tool", "spiffe://corp.example/ns/payments-live/people/system_3aserviceaccount_3aops_3atool"},
		{"a_b", "spiffe://corp.example/ns/payments-live/people/a_5fb"},
		{"a_5fb", "spiffe://corp.example/ns/payments-live/people/a_5f5fb"},
		{"https://idp.example#42", "spiffe://corp.example/ns/payments-live/people/https_3a_2f_2fidp.example_2342"},
		{"Jo Bloggs+oncall", "spiffe://corp.example/ns/payments-live/people/Jo_20Bloggs_2boncall"},
		{"...", "spiffe://corp.example/ns/payments-live/people/..."},
	} {
		id, err := service.PersonID("corp.example", "payments-live", tt.user)
		if err != nil || id.String() != tt.want {
			t.Errorf("PersonID(%q) = %v, %v; want %s", tt.user, id, err, tt.want)
			continue
		}
		if parsed, err := service.ParseIdentity(tt.want); err != nil || parsed != id {
			t.Errorf("ParseIdentity(%s) = %v, %v; want the person's identity", tt.want, parsed, err)
		}
	}
	for _, user := range []string{"", ".", "..", "José", "tab\there", "nul\x00", "del\x7f"} {
		if id, err := service.PersonID("corp.example", "payments-live", user); err == nil {
			t.Errorf("PersonID(%q) = %v, want an error: no identity can be its", user, id)
		}
	}
	for _, s := range []string{
		"spiffe://corp.example/ns/payments-live/people/alice_41",  // 'A', which is never escaped
		"spiffe://corp.example/ns/payments-live/people/alice_2e",  // '.', likewise
		"spiffe://corp.example/ns/payments-live/people/alice_4",   // one hex digit
		"spiffe://corp.example/ns/payments-live/people/alice_",    // none
		"spiffe://corp.example/ns/payments-live/people/alice_4A",  // upper-case hex
		"spiffe://corp.example/ns/payments-live/people/alice_e9",  // a byte outside printable ASCII
		"spiffe://corp.example/ns/payments-live/people/alice_0a",  // a control character
		"spiffe://corp.example/ns/payments-live/people/alice_zz",  // no hex at all
		"spiffe://corp.example/ns/payments-live/people/_5f_5fx_5", // a broken last escape
	} {
		if id, err := service.ParseIdentity(s); err == nil {
			t.Errorf("ParseIdentity(%s) = %v, want it refused: no user name maps to it", s, id)
		}
	}
}
