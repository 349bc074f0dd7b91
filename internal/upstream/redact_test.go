package upstream_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

// encodings of a key, each character chosen by a digit of choice: plain,
// \u with lower or upper hex, %XX with lower or upper hex, a JSON-escaped
// percent sign before plain or JSON-escaped hex digits, or an HTML
// character reference in decimal or hex.
func encodeKey(key string, choice uint64) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch choice % 9 {
		case 0:
			b.WriteByte(c)
		case 1:
			fmt.Fprintf(&b, `\u%04x`, c)
		case 2:
			fmt.Fprintf(&b, `\u%04X`, c)
		case 3:
			fmt.Fprintf(&b, `%%%02x`, c)
		case 4:
			fmt.Fprintf(&b, `%%%02X`, c)
		case 5:
			fmt.Fprintf(&b, `\u0025%02X`, c)
		case 6:
			b.WriteString(escapedPercentDigits(key[i : i+1]))
		case 7:
			fmt.Fprintf(&b, "&#%d;", c)
		case 8:
			fmt.Fprintf(&b, "&#x%x;", c)
		}
		choice /= 9
		if choice == 0 {
			choice = uint64(i) * 2654435761 // keep mixing past the choice's digits
		}
	}
	return b.String()
}

// escapedPercentDigits writes each character as %XX with the percent sign
// and both hex digits JSON-escaped: \u0025\u0036\u0043 for "l".
func escapedPercentDigits(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		b.WriteString(`\u0025`)
		for _, d := range fmt.Sprintf("%02X", key[i]) {
			fmt.Fprintf(&b, `\u%04x`, d)
		}
	}
	return b.String()
}

// leaks reports whether a reader of b could recover key from it: as plain
// bytes, after JSON-unescaping, after percent-decoding, or both in either
// order; and, when b is JSON, in any string it holds, decoded the same ways.
// Each decoder here is a plain left-to-right one, independent of the
// redactor's.
func leaks(b []byte, key string) bool {
	k := []byte(key)
	forms := [][]byte{b, unescapeJSON(b), unpercent(b), unpercent(unescapeJSON(b)), unescapeJSON(unpercent(b)), unhtml(b), unhtml(unescapeJSON(b))}
	var v any
	if json.Unmarshal(b, &v) == nil {
		for _, s := range jsonStrings(v) {
			sb := []byte(s)
			forms = append(forms, sb, unpercent(sb), unescapeJSON(sb), unpercent(unescapeJSON(sb)), unhtml(sb))
		}
	}
	for _, f := range forms {
		if bytes.Contains(f, k) || bytes.Contains(unbase64(f), k) || bytes.Contains(unhex(f), k) {
			return true
		}
	}
	return false
}

// unhtml decodes HTML character references, as html.UnescapeString does.
func unhtml(b []byte) []byte { return []byte(html.UnescapeString(string(b))) }

// unbase64 decodes every run of base64 characters in b (either alphabet,
// any padding), at each of the four places a group of four may start, and
// returns the decodings joined.
func unbase64(b []byte) []byte {
	isB64 := func(c byte) bool {
		return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("+/-_", c) >= 0
	}
	var out []byte
	for _, run := range runs(b, isB64) {
		std := strings.NewReplacer("-", "+", "_", "/").Replace(string(run))
		for k := 0; k < 4 && k < len(std); k++ {
			r := std[k:]
			if len(r)%4 == 1 {
				r = r[:len(r)-1]
			}
			d, _ := base64.RawStdEncoding.DecodeString(r)
			out = append(append(out, d...), 0)
		}
	}
	return out
}

// unhex decodes every run of hex digits in b, from its first and its second
// digit, and returns the decodings joined.
func unhex(b []byte) []byte {
	var out []byte
	for _, run := range runs(b, func(c byte) bool { return isHex([]byte{c}) }) {
		for k := 0; k < 2 && k < len(run); k++ {
			r := run[k:]
			d, _ := hex.DecodeString(string(r[:len(r)/2*2]))
			out = append(append(out, d...), 0)
		}
	}
	return out
}

// runs returns the maximal runs of b whose bytes satisfy in.
func runs(b []byte, in func(byte) bool) [][]byte {
	var out [][]byte
	start := -1
	for i := 0; i <= len(b); i++ {
		if i < len(b) && in(b[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			out = append(out, b[start:i])
			start = -1
		}
	}
	return out
}

// binaryEncodings are the ways a provider might carry bytes holding the
// key: base64 in both alphabets, padded or not, and hex in either case.
var binaryEncodings = []struct {
	name   string
	encode func(string) string
}{
	{"base64", func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }},
	{"base64url", func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }},
	{"base64 raw", func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte(s)) }},
	{"base64url raw", func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }},
	{"hex", func(s string) string { return hex.EncodeToString([]byte(s)) }},
	{"HEX", func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }},
}

func jsonStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, jsonStrings(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for k, e := range v {
			out = append(out, k)
			out = append(out, jsonStrings(e)...)
		}
		return out
	}
	return nil
}

// unescapeJSON decodes \uXXXX (BMP only, enough for ASCII keys) and the
// short escapes wherever they appear.
func unescapeJSON(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+1 < len(b) {
			switch c := b[i+1]; c {
			case '"', '\\', '/':
				out = append(out, c)
				i++
				continue
			case 'u':
				var r rune
				if i+6 <= len(b) {
					if _, err := fmt.Sscanf(string(b[i+2:i+6]), "%04x", &r); err == nil && isHex(b[i+2:i+6]) {
						out = fmt.Appendf(out, "%c", r)
						i += 5
						continue
					}
				}
			}
		}
		out = append(out, b[i])
	}
	return out
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !strings.ContainsRune("0123456789abcdefABCDEF", rune(c)) {
			return false
		}
	}
	return true
}

// unpercent decodes %XX wherever it appears, leaving any other % alone.
func unpercent(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '%' && i+3 <= len(b) && isHex(b[i+1:i+3]) {
			var v byte
			fmt.Sscanf(string(b[i+1:i+3]), "%02x", &v)
			out = append(out, v)
			i += 2
			continue
		}
		out = append(out, b[i])
	}
	return out
}

const redactKey = "sk_live_SENTINEL_9z/Q+x"

func TestRedactEncodings(t *testing.T) {
	t.Parallel()
	every := func(format string) string {
		var b strings.Builder
		for i := 0; i < len(redactKey); i++ {
			fmt.Fprintf(&b, format, redactKey[i])
		}
		return b.String()
	}
	tests := []struct {
		name string
		enc  string
	}{
		{"plain", redactKey},
		{"one char escaped", strings.Replace(redactKey, "l", `\u006c`, 1)},
		{"one char escaped upper", strings.Replace(redactKey, "_", `\u005F`, 1)},
		{"solidus escaped", strings.Replace(redactKey, "/", `\/`, 1)},
		{"every char escaped lower", every(`\u%04x`)},
		{"every char escaped upper", every(`\u%04X`)},
		{"every char percent lower", every(`%%%02x`)},
		{"every char percent upper", every(`%%%02X`)},
		{"percent mix", strings.NewReplacer("_", "%5f", "S", "%53", "+", "%2B").Replace(redactKey)},
		{"escaped percent", every(`\u0025%02x`)},
		{"escaped percent and digits", escapedPercentDigits(redactKey)},
		{"mixed", encodeKey(redactKey, 0x5eed5eed5eed)},
		{"HTML decimal", every(`&#%d;`)},
		{"HTML hex", every(`&#x%x;`)},
		{"HTML named", strings.NewReplacer("_", "&lowbar;", "/", "&sol;", "+", "&plus;", "S", "&#83;").Replace(redactKey)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// In a JSON string, as in a 2xx reply: the result must stay a
			// JSON object, with the rest of it untouched.
			body := []byte(`{"id":"pay_1","note":"key=` + tt.enc + `;","n":[1.5,"` + tt.enc + tt.enc + `"],"` + tt.enc + `":true}`)
			got := upstream.Redact(redactKey, body)
			if leaks(got, redactKey) {
				t.Errorf("Redact(%s) = %s, which still holds the key", body, got)
			}
			var obj map[string]any
			if err := json.Unmarshal(got, &obj); err != nil {
				t.Fatalf("Redact(%s) = %s, not a JSON object: %v", body, got, err)
			}
			if obj["id"] != "pay_1" || obj["note"] != "key=[REDACTED];" || obj["[REDACTED]"] != true {
				t.Errorf("Redact(%s) = %s, want the key replaced and the rest kept", body, got)
			}
			// In arbitrary text, as in an error page.
			text := []byte("<p>bad key: " + tt.enc + "</p>")
			if got := upstream.Redact(redactKey, text); leaks(got, redactKey) {
				t.Errorf("Redact(%s) = %s, which still holds the key", text, got)
			}
		})
	}
}

// HTML character references need no semicolon; a semicolon right after
// the last one is read as part of it, as a browser reads it.
func TestRedactHTMLWithoutSemicolons(t *testing.T) {
	t.Parallel()
	var enc strings.Builder
	for i := 0; i < len(redactKey); i++ {
		fmt.Fprintf(&enc, "&#X%X", redactKey[i])
	}
	text := []byte("<p>bad key: " + enc.String() + "</p>")
	got := upstream.Redact(redactKey, text)
	if leaks(got, redactKey) || string(got) != "<p>bad key: [REDACTED]</p>" {
		t.Errorf("Redact(%s) = %s, want the key replaced and the rest kept", text, got)
	}
}

// The key inside bytes a provider base64- or hex-encodes, at every byte
// alignment: as a Basic credential, in a JSON string (with / escaped), and
// percent-encoded in a URL.
func TestRedactBinaryEncodings(t *testing.T) {
	t.Parallel()
	redact := upstream.Redactor(redactKey)
	for _, enc := range binaryEncodings {
		for _, around := range [][2]string{{"", ""}, {"u", "!"}, {"us", "!!"}, {"user:", ""}, {"{\"k\":\"", "\"}"}} {
			text := enc.encode(around[0] + redactKey + around[1])
			name := fmt.Sprintf("%s/%q", enc.name, around[0])
			bodies := []string{
				`{"id":"pay_1","auth":"Basic ` + text + `","echo":"` + strings.ReplaceAll(text, "/", `\/`) + `"}`,
				"<p>Authorization: Basic " + text + "</p>",
				"https://provider.example/debug?blob=" + url.QueryEscape(text) + "&x=1",
			}
			for _, body := range bodies {
				got := redact([]byte(body))
				if leaks(got, redactKey) {
					t.Errorf("%s: Redact(%s) = %s, which still holds the key", name, body, got)
				}
				if json.Valid([]byte(body)) {
					var obj map[string]any
					if err := json.Unmarshal(got, &obj); err != nil {
						t.Errorf("%s: Redact(%s) = %s, not a JSON object: %v", name, body, got, err)
					} else if obj["id"] != "pay_1" {
						t.Errorf("%s: Redact(%s) = %s, want the rest kept", name, body, got)
					}
				}
			}
		}
	}
	// Encoded bytes that hold some other key are left alone.
	for _, enc := range binaryEncodings {
		body := []byte(`{"blob":"` + enc.encode("sk_live_OTHER_KEY_0123456789") + `"}`)
		if got := redact(body); !bytes.Equal(got, body) {
			t.Errorf("%s: Redact(%s) = %s, want it unchanged", enc.name, body, got)
		}
	}
}

// The usual reply, with no key and nothing escaped, is returned as it is.
func TestRedactFastPath(t *testing.T) {
	body := []byte(`{"id":"pay_1","status":"COMPLETED","amountMoney":{"amount":1250,"currency":"USD"}}`)
	redact := upstream.Redactor(redactKey)
	if got := redact(body); &got[0] != &body[0] {
		t.Errorf("Redact copied a reply with nothing to redact")
	}
	if n := testing.AllocsPerRun(100, func() { redact(body) }); n != 0 {
		t.Errorf("Redact of a clean reply allocates %v times, want 0", n)
	}
	// Escapes without the key leave a JSON body byte for byte.
	escaped := []byte(`{"note":"caf\u00e9 50%25 off \/ \"quoted\""}`)
	if got := upstream.Redact(redactKey, escaped); !bytes.Equal(got, escaped) {
		t.Errorf("Redact(%s) = %s, want it unchanged", escaped, got)
	}
}

// FuzzRedact checks that the key, written in any mix of the encodings, and
// put anywhere in a JSON string or in arbitrary bytes, never survives
// redaction, and that a JSON body stays JSON.
func FuzzRedact(f *testing.F) {
	f.Add("", "", uint64(0))
	f.Add("a\\", "b", uint64(1))
	f.Add("%", "%41", uint64(3))
	f.Add("\\u00", "\"", uint64(12345))
	f.Add("sk_live_", redactKey[:5], uint64(777777))
	f.Fuzz(func(t *testing.T, prefix, suffix string, choice uint64) {
		enc := encodeKey(redactKey, choice)
		raw := []byte(prefix + enc + suffix)
		if got := upstream.Redact(redactKey, raw); leaks(got, redactKey) {
			t.Fatalf("Redact(%q) = %q, which still holds the key", raw, got)
		}
		// The key inside bytes carried base64- or hex-encoded, the prefix
		// setting its alignment.
		be := binaryEncodings[choice%uint64(len(binaryEncodings))]
		bin := []byte("x " + be.encode(prefix+redactKey+suffix) + " y")
		if got := upstream.Redact(redactKey, bin); leaks(got, redactKey) {
			t.Fatalf("Redact(%q) = %q (%s), which still holds the key", bin, got, be.name)
		}
		// As a JSON string: the prefix and suffix JSON-encoded, the key's
		// encoding as it is (it is valid inside a JSON string).
		p, _ := json.Marshal(prefix)
		s, _ := json.Marshal(suffix)
		body := []byte(`{"v":` + string(p[:len(p)-1]) + enc + string(s[1:]) + `}`)
		if !json.Valid(body) {
			return // e.g. the prefix ends in a backslash escape the key's encoding completes oddly
		}
		got := upstream.Redact(redactKey, body)
		if leaks(got, redactKey) {
			t.Fatalf("Redact(%s) = %s, which still holds the key", body, got)
		}
		var obj map[string]any
		if err := json.Unmarshal(got, &obj); err != nil {
			t.Fatalf("Redact(%s) = %s, not a JSON object: %v", body, got, err)
		}
	})
}

// Through the client: the key, in every encoding, is gone from a 2xx
// reply's Body and Payment and from an error's body.
func TestKeyRedactedInReplies(t *testing.T) {
	t.Parallel()
	encs := []string{
		redactKey,
		encodeKey(redactKey, 1),
		encodeKey(redactKey, 2),
		encodeKey(redactKey, 3),
		encodeKey(redactKey, 4),
		encodeKey(redactKey, 5),
		encodeKey(redactKey, 0xfeedface),
	}
	for _, be := range binaryEncodings {
		encs = append(encs, be.encode("Bearer "+redactKey))
	}
	for i, enc := range encs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			body := `{"id":"pay_1","echo":"` + enc + `","nested":{"` + enc + `":["` + enc + `"]}}`
			for _, status := range []int{http.StatusOK, http.StatusCreated, http.StatusBadRequest, http.StatusConflict, http.StatusBadGateway} {
				srv := newServer(t, nil)
				srv.SetScript(func(int, simulator.Request) simulator.Reply { return reply(status, body) })
				srv.AllowKey(redactKey)
				cfg := testConfig(t, srv.URL)
				cfg.APIKey = redactKey
				cfg.MaxRequests = 1
				c := newClient(t, cfg)
				r, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
				if status < 300 {
					if err != nil {
						t.Fatalf("%d reply: %v", status, err)
					}
					pj, _ := protojson.Marshal(r.Payment())
					if leaks(r.Body, redactKey) || leaks(pj, redactKey) {
						t.Errorf("%d reply Body %s or Payment %s holds the key", status, r.Body, pj)
					}
					if r.Payment().GetFields()["id"].GetStringValue() != "pay_1" || !json.Valid(r.Body) {
						t.Errorf("%d reply Body %s: want valid JSON with the rest kept", status, r.Body)
					}
					continue
				}
				se := statusError(t, err)
				if leaks(se.Body, redactKey) || strings.Contains(fmt.Sprintf("%+v", err), redactKey) {
					t.Errorf("%d StatusError.Body %s holds the key", status, se.Body)
				}
			}
		})
	}
}
