package service

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// An Identity is who a caller is, as its verified client certificate says:
// a SPIFFE ID, from the certificate's one URI SAN, or a DNS name, from its
// one DNS SAN. The two are distinct kinds: an identity of one kind never
// equals, and is never taken for, one of the other. Identities are
// compared byte for byte, with no normalisation at all: a SPIFFE ID must be
// written in its one valid spelling (lower-case scheme and trust domain, no
// port, user, query, fragment, percent-encoding, empty, dot or trailing
// segment), and a DNS name in lower case, or it is no identity.
type Identity struct {
	kind  identityKind
	value string
}

type identityKind uint8

const (
	kindSPIFFE identityKind = iota + 1
	kindDNS
)

// dnsPrefix is how configuration (and records, logs and the API) write a
// DNS-name identity, so that it can never be read as a SPIFFE ID, nor a
// SPIFFE ID as a DNS name.
const dnsPrefix = "dns:"

// String is the identity as configuration writes it and as records, logs,
// audit entries and the API show it: the SPIFFE ID itself
// (spiffe://corp.example/ns/shop/sa/checkout), or dns: and the name
// (dns:billing.corp.example).
func (id Identity) String() string {
	if id.kind == kindDNS {
		return dnsPrefix + id.value
	}
	return id.value
}

// IsZero reports whether id is no identity.
func (id Identity) IsZero() bool { return id.kind == 0 }

// ParseIdentity reads an identity as configuration writes it: a SPIFFE ID
// (spiffe://trust-domain/path) or dns: and a lower-case host name
// (dns:billing.corp.example). Anything else, including a SPIFFE ID in any
// spelling but its one valid one, is refused: the identity it was meant to
// name would never match. So is a person's SPIFFE ID whose user name is
// not written as PersonID writes it (alice_41 for Alice, say): no
// certificate would ever name it.
func ParseIdentity(s string) (Identity, error) {
	switch {
	case strings.HasPrefix(s, "spiffe://"):
		if err := checkSPIFFEID(s); err != nil {
			return Identity{}, err
		}
		if err := checkPersonPath(s); err != nil {
			return Identity{}, err
		}
		return Identity{kind: kindSPIFFE, value: s}, nil
	case strings.HasPrefix(s, dnsPrefix):
		name := strings.TrimPrefix(s, dnsPrefix)
		if err := checkDNSName(name); err != nil {
			return Identity{}, err
		}
		return Identity{kind: kindDNS, value: name}, nil
	}
	return Identity{}, errors.New("want a SPIFFE ID (spiffe://trust-domain/path) or dns: and a host name (dns:billing.corp.example)")
}

// checkSPIFFEID reports whether s is a SPIFFE ID in its one valid
// spelling, as go-spiffe's parser reads the SPIFFE-ID standard; and, should
// that parser be built with its back-compatible character set, in the
// standard's strict one still.
func checkSPIFFEID(s string) error {
	id, err := spiffeid.FromString(s)
	if err != nil {
		return fmt.Errorf("not a valid SPIFFE ID: %w", err)
	}
	if id.String() != s {
		return errors.New("not a SPIFFE ID in its one valid spelling")
	}
	td, path := s[len("spiffe://"):], ""
	if i := strings.IndexByte(td, '/'); i >= 0 {
		td, path = td[:i], td[i:]
	}
	for i := 0; i < len(td); i++ {
		if c := td[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return errors.New("not a valid SPIFFE ID: the trust domain holds a character outside a-z 0-9 . - _")
		}
	}
	for i := 0; i < len(path); i++ {
		if c := path[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_' || c == '/') {
			return errors.New("not a valid SPIFFE ID: the path holds a character outside A-Z a-z 0-9 . - _")
		}
	}
	return nil
}

// checkDNSName reports whether name is a lower-case host name: labels of
// a-z, 0-9 and inner hyphens, of 1 to 63 bytes, separated by single dots,
// 253 bytes at most, with no trailing dot and no wildcard.
func checkDNSName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a host name: want 1 to 253 bytes")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("not a host name: want labels of 1 to 63 bytes separated by single dots, neither starting nor ending with a hyphen")
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return errors.New("not a lower-case host name: want only a-z, 0-9, hyphens and dots")
			}
		}
	}
	return nil
}

// oidSubjectAltName is the X.509 SubjectAltName extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// GeneralName tags (RFC 5280 4.2.1.6) that can name an identity.
const (
	tagDNSName = 2
	tagURI     = 6
)

// subjectAltNames returns the certificate's URI and DNS SANs exactly as
// encoded. crypto/x509 parses URI SANs into url.URL, whose String() is not
// the SAN: it drops an empty fragment and lower-cases the scheme, so the
// raw bytes are read here from the extension itself. Every other kind of
// name (email, IP, directory, other) is counted, and names nothing.
func subjectAltNames(cert *x509.Certificate) (uris, dnsNames []string, err error) {
	seen := false
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		if seen {
			return nil, nil, errors.New("the certificate has two SubjectAltName extensions")
		}
		seen = true
		var seq asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &seq)
		if err != nil || len(rest) > 0 || seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence || !seq.IsCompound {
			return nil, nil, errors.New("the certificate's SubjectAltName extension is malformed")
		}
		for b := seq.Bytes; len(b) > 0; {
			var name asn1.RawValue
			if b, err = asn1.Unmarshal(b, &name); err != nil || name.Class != asn1.ClassContextSpecific {
				return nil, nil, errors.New("the certificate's SubjectAltName extension is malformed")
			}
			switch name.Tag {
			case tagURI, tagDNSName:
				if name.IsCompound {
					return nil, nil, errors.New("the certificate's SubjectAltName extension is malformed")
				}
				if name.Tag == tagURI {
					uris = append(uris, string(name.Bytes))
				} else {
					dnsNames = append(dnsNames, string(name.Bytes))
				}
			}
		}
	}
	return uris, dnsNames, nil
}

// certIdentity is the identity the verified client certificate cert names,
// or an error saying why it names none:
//
//   - a certificate with a URI SAN is a SPIFFE ID: exactly one URI SAN,
//     which must be a SPIFFE ID in its one valid spelling (an X.509-SVID
//     has exactly one); its other names (DNS, email, IP) name nothing;
//   - a certificate with no URI SAN is a DNS name: exactly one DNS SAN,
//     a lower-case host name;
//   - nothing else names anyone: not the Subject's common name, not an
//     email address or IP address, not a second name of either kind.
func certIdentity(cert *x509.Certificate) (Identity, error) {
	uris, dnsNames, err := subjectAltNames(cert)
	switch {
	case err != nil:
		return Identity{}, err
	case len(uris) > 1:
		return Identity{}, errors.New("the certificate has more than one URI SAN; a SPIFFE identity document has exactly one")
	case len(uris) == 1:
		if err := checkSPIFFEID(uris[0]); err != nil {
			return Identity{}, fmt.Errorf("the certificate's URI SAN is %w", err)
		}
		return Identity{kind: kindSPIFFE, value: uris[0]}, nil
	case len(dnsNames) > 1:
		return Identity{}, errors.New("the certificate has no URI SAN and more than one DNS SAN: it names no one identity")
	case len(dnsNames) == 1:
		if err := checkDNSName(dnsNames[0]); err != nil {
			return Identity{}, fmt.Errorf("the certificate's DNS SAN is %w", err)
		}
		return Identity{kind: kindDNS, value: dnsNames[0]}, nil
	}
	return Identity{}, errors.New("the certificate has no URI SAN (SPIFFE ID) and no DNS SAN")
}

// identitySet holds identities by kind and value: an identity of one kind
// is never in a set for holding one of the other, whatever its text.
type identitySet map[Identity]bool

func newIdentitySet(ids []Identity) identitySet {
	if len(ids) == 0 {
		return nil
	}
	s := identitySet{}
	for _, id := range ids {
		if !id.IsZero() {
			s[id] = true
		}
	}
	return s
}

// has reports whether id is in the set; no identity never is.
func (s identitySet) has(id Identity) bool {
	return !id.IsZero() && s[id]
}

// PersonID is the identity of a person on call in a Kubernetes namespace,
// as deploy/cluster/policies.yaml has approver-policy issue it (the
// CertificateRequestPolicy payments-people) for the user name the API
// server puts on the person's request:
//
//	spiffe://<trustDomain>/ns/<namespace>/people/<user name>
//
// The user name is written byte for byte, case kept (Kubernetes' user
// names are case-sensitive), except that each byte outside A-Z a-z 0-9 .
// and - is written as _ and its two lower-case hex digits: alice@corp.example
// is alice_40corp.example, oidc:Bob is oidc_3aBob, a_b is a_5fb. So every
// user name of printable ASCII has exactly one identity, no two share one,
// and each is a valid SPIFFE ID. A user name with a byte outside printable
// ASCII (0x20 to 0x7e), empty, "." or ".." has none: the policy refuses
// to sign for it.
func PersonID(trustDomain, namespace, userName string) (Identity, error) {
	name, err := escapeUserName(userName)
	if err != nil {
		return Identity{}, err
	}
	s := "spiffe://" + trustDomain + "/ns/" + namespace + "/people/" + name
	if err := checkSPIFFEID(s); err != nil {
		return Identity{}, err
	}
	return Identity{kind: kindSPIFFE, value: s}, nil
}

// plainUserNameByte reports whether c is written as itself in a person's
// SPIFFE ID.
func plainUserNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-'
}

// escapeUserName writes a user name as PersonID does.
func escapeUserName(userName string) (string, error) {
	switch userName {
	case "":
		return "", errors.New("a person's user name is empty")
	case ".", "..":
		return "", errors.New("a person's user name may not be . or ..: no SPIFFE ID can name it")
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(userName); i++ {
		switch c := userName[i]; {
		case c < 0x20 || c > 0x7e:
			return "", errors.New("a person's user name holds a byte outside printable ASCII: no identity is written for it")
		case plainUserNameByte(c):
			b.WriteByte(c)
		default:
			b.WriteByte('_')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
	return b.String(), nil
}

// checkPersonPath refuses a person's SPIFFE ID (…/ns/<namespace>/people/
// <name>) whose name is not one that PersonID writes for some user name.
func checkPersonPath(id string) error {
	parts := strings.Split(id[len("spiffe://"):], "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "people" {
		return nil
	}
	name := parts[4]
	for i := 0; i < len(name); i++ {
		if name[i] != '_' {
			continue
		}
		if i+2 >= len(name) {
			return errors.New("not a person's identity as it is issued: _ must be followed by two lower-case hex digits (see docs/identity.md, people's identities)")
		}
		c, ok := unhex(name[i+1], name[i+2])
		if !ok || c < 0x20 || c > 0x7e || plainUserNameByte(c) {
			return errors.New("not a person's identity as it is issued: each byte outside A-Z a-z 0-9 . - of the user name is _ and its two lower-case hex digits, and no other is (see docs/identity.md, people's identities)")
		}
		i += 2
	}
	return nil
}

// unhex reads two lower-case hex digits.
func unhex(hi, lo byte) (byte, bool) {
	digit := func(c byte) (byte, bool) {
		switch {
		case '0' <= c && c <= '9':
			return c - '0', true
		case 'a' <= c && c <= 'f':
			return c - 'a' + 10, true
		}
		return 0, false
	}
	h, ok1 := digit(hi)
	l, ok2 := digit(lo)
	return h<<4 | l, ok1 && ok2
}
