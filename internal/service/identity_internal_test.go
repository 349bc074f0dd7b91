package service

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"testing"
	"time"
)

// generalName is one SubjectAltName entry, encoded as given.
type generalName struct {
	tag   int
	value string
}

// GeneralName tags used here besides tagDNSName and tagURI.
const (
	tagEmail = 1
	tagIP    = 7
)

// sanCert returns a certificate whose SubjectAltName extension holds names
// exactly as given (crypto/x509 would refuse to write some of them), with
// subject common name cn, as crypto/x509 parses it.
func sanCert(t *testing.T, cn string, names ...generalName) (*x509.Certificate, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	if len(names) > 0 {
		raw := make([]asn1.RawValue, len(names))
		for i, n := range names {
			raw[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: n.tag, Bytes: []byte(n.value)}
		}
		b, err := asn1.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: oidSubjectAltName, Value: b}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return x509.ParseCertificate(der)
}

const (
	oncallID   = "spiffe://corp.example/ns/ops/sa/oncall"
	checkoutID = "spiffe://corp.example/ns/shop/sa/checkout"
)

// TestCertIdentity: a certificate names one identity, of one kind, in its
// one spelling; every other spelling of an identity, and every other
// place one could be written, names nobody. Certificates that crypto/x509
// itself refuses to parse (as the TLS handshake would) are refused too.
func TestCertIdentity(t *testing.T) {
	t.Parallel()
	uri := func(v string) generalName { return generalName{tagURI, v} }
	dns := func(v string) generalName { return generalName{tagDNSName, v} }
	tests := []struct {
		name  string
		cn    string
		names []generalName
		want  string // the identity's text; "" for none
	}{
		{"SPIFFE ID", "", []generalName{uri(oncallID)}, oncallID},
		{"DNS name", "", []generalName{dns("billing.corp.example")}, "dns:billing.corp.example"},
		{"SPIFFE ID with a DNS SAN and an email besides", "", []generalName{dns("oncall.ops.corp.example"), uri(oncallID), {tagEmail, "oncall@corp.example"}}, oncallID},
		{"path case is part of the ID", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/ONCALL")}, "spiffe://corp.example/ns/ops/sa/ONCALL"},

		{"DNS SAN holding a SPIFFE ID", "", []generalName{dns(oncallID)}, ""},
		{"empty fragment", "", []generalName{uri(oncallID + "#")}, ""},
		{"fragment", "", []generalName{uri(oncallID + "#x")}, ""},
		{"upper-case scheme", "", []generalName{uri("SPIFFE://corp.example/ns/ops/sa/oncall")}, ""},
		{"mixed-case scheme", "", []generalName{uri("Spiffe://corp.example/ns/ops/sa/oncall")}, ""},
		{"trailing slash", "", []generalName{uri(oncallID + "/")}, ""},
		{"percent-encoding", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/%6Fncall")}, ""},
		{"port", "", []generalName{uri("spiffe://corp.example:443/ns/ops/sa/oncall")}, ""},
		{"userinfo", "", []generalName{uri("spiffe://admin@corp.example/ns/ops/sa/oncall")}, ""},
		{"query", "", []generalName{uri(oncallID + "?admin=1")}, ""},
		{"empty query", "", []generalName{uri(oncallID + "?")}, ""},
		{"mixed-case trust domain", "", []generalName{uri("spiffe://Corp.example/ns/ops/sa/oncall")}, ""},
		{"dot segment", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/./oncall")}, ""},
		{"dot-dot segment", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/x/../oncall")}, ""},
		{"empty segment", "", []generalName{uri("spiffe://corp.example/ns/ops//sa/oncall")}, ""},
		{"no path", "", []generalName{uri("spiffe://corp.example")}, "spiffe://corp.example"},
		{"leading space", "", []generalName{uri(" " + oncallID)}, ""},
		{"trailing space", "", []generalName{uri(oncallID + " ")}, ""},
		{"NUL at the end", "", []generalName{uri(oncallID + "\x00")}, ""},
		{"NUL inside", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/oncall\x00.evil")}, ""},
		{"non-ASCII look-alike", "", []generalName{uri("spiffe://corp.example/ns/ops/sa/onc\u0430ll")}, ""},
		{"second URI SAN", "", []generalName{uri("spiffe://corp.example/ns/shop/sa/nobody"), uri(oncallID)}, ""},
		{"the same URI SAN twice", "", []generalName{uri(oncallID), uri(oncallID)}, ""},
		{"valid URI SAN and an invalid one", "", []generalName{uri(oncallID), uri("SPIFFE://corp.example/x")}, ""},
		{"email SAN holding a SPIFFE ID", "", []generalName{{tagEmail, oncallID}}, ""},
		{"email SAN", "", []generalName{{tagEmail, "oncall@corp.example"}}, ""},
		{"Subject CN holding a SPIFFE ID", oncallID, nil, ""},
		{"Subject CN holding a DNS name", "billing.corp.example", nil, ""},
		{"IP SAN", "", []generalName{{tagIP, "\x7f\x00\x00\x01"}}, ""},
		{"URI SAN spelling a DNS identity", "", []generalName{uri("dns:billing.corp.example")}, ""},
		{"DNS SAN spelling a DNS identity", "", []generalName{dns("dns:billing.corp.example")}, ""},
		{"upper-case DNS name", "", []generalName{dns("BILLING.corp.example")}, ""},
		{"DNS name with a trailing dot", "", []generalName{dns("billing.corp.example.")}, ""},
		{"wildcard DNS name", "", []generalName{dns("*.corp.example")}, ""},
		{"DNS name with NUL", "", []generalName{dns("billing.corp.example\x00.evil")}, ""},
		{"two DNS SANs", "", []generalName{dns("billing.corp.example"), dns("checkout.corp.example")}, ""},
		{"URI SAN that is no SPIFFE ID, with a DNS SAN", "", []generalName{uri("https://billing.corp.example"), dns("billing.corp.example")}, ""},
		{"no names", "", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cert, err := sanCert(t, tt.cn, tt.names...)
			if err != nil {
				// crypto/x509 refuses it, as the handshake would.
				if tt.want != "" {
					t.Fatalf("x509.ParseCertificate = %v, want a certificate naming %s", err, tt.want)
				}
				return
			}
			id, err := certIdentity(cert)
			if got := id.String(); got != tt.want || (tt.want == "") != (err != nil) {
				t.Errorf("certIdentity(%+v, CN %q) = %q, %v; want %q", tt.names, tt.cn, got, err, tt.want)
			}
		})
	}
}

// TestIdentityKindsNeverMatch: a set of identities admits exactly the
// identities in it: never one of the other kind with the same name.
func TestIdentityKindsNeverMatch(t *testing.T) {
	t.Parallel()
	dnsID, err := ParseIdentity("dns:billing.corp.example")
	if err != nil {
		t.Fatal(err)
	}
	spiffe, err := ParseIdentity(oncallID)
	if err != nil {
		t.Fatal(err)
	}
	set := newIdentitySet([]Identity{dnsID, spiffe})
	for _, id := range []Identity{
		{kind: kindSPIFFE, value: "dns:billing.corp.example"},
		{kind: kindSPIFFE, value: "billing.corp.example"},
		{kind: kindDNS, value: oncallID},
		{kind: kindDNS, value: "dns:billing.corp.example"},
		{},
	} {
		if set.has(id) {
			t.Errorf("set of %s and %s has %+v", dnsID, spiffe, id)
		}
	}
	if !set.has(dnsID) || !set.has(spiffe) {
		t.Errorf("set lacks its own identities")
	}
}

// TestParseIdentity: configuration writes each kind explicitly, in its
// one valid spelling.
func TestParseIdentity(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		oncallID:                             oncallID,
		"spiffe://corp.example/people/alice": "spiffe://corp.example/people/alice",
		"dns:billing.corp.example":           "dns:billing.corp.example",
	} {
		id, err := ParseIdentity(in)
		if err != nil || id.String() != want {
			t.Errorf("ParseIdentity(%q) = %q, %v; want %q", in, id, err, want)
		}
	}
	for _, in := range []string{
		"billing.corp.example", // which kind?
		"DNS:billing.corp.example",
		"dns:Billing.corp.example",
		"dns:",
		"uri:" + oncallID,
		"SPIFFE://corp.example/ns/ops/sa/oncall",
		oncallID + "/",
		oncallID + "#",
		"spiffe://corp.example/ns/ops/sa/%6Fncall",
		"spiffe://Corp.example/x",
		"spiffe://corp.example:443/x",
		"spiffe://",
		"email:oncall@corp.example",
		"",
	} {
		if id, err := ParseIdentity(in); err == nil {
			t.Errorf("ParseIdentity(%q) = %q, want an error", in, id)
		}
	}
}
