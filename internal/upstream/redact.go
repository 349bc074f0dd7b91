package upstream

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// redactedMark replaces every occurrence of the key.
const redactedMark = "[REDACTED]"

// redactor removes one key from provider replies and error texts in every
// form a reader of them could turn back into the key: plain bytes, JSON
// string escapes (\u006c, \/ and the like, in any mix and either case of
// hex), percent-encoding (%6C or %6c, in any mix), and percent-encoding
// whose characters are themselves JSON-escaped, and HTML character
// references (&#47;, &#x2F;, &sol; and every other named one). It also
// removes the key base64-encoded (standard or URL alphabet, padded or not,
// at any of the three byte alignments inside a longer encoded value, with
// + and / percent-encoded, or / written \/) and hex-encoded (either case).
//
// A body that is a JSON document stays one: the key is removed from inside
// each string that holds it, and the string is encoded again. Whatever a
// JSON reading cannot account for (a key in a number, or one that spans
// the document's structure) is removed from the raw bytes as well, which
// may leave the body malformed; a malformed 2xx reply is reported as such,
// never passed on with the key in it.
type redactor struct {
	key   string
	forms []encodedForm
}

// encodedForm is a stretch of text that only an encoding of the key
// produces.
type encodedForm struct {
	text []byte
	// base64 marks a form cut from the middle of a base64 encoding: the
	// characters either side of it may each carry a few of the key's bits,
	// and are removed with it.
	base64 bool
}

// minEncodedForm is the shortest encoded form the redactor looks for. A
// shorter one (base64 of a key under ten bytes, hex of one under six)
// could turn up by chance in a reply, which removing it would corrupt;
// such a key is still removed in every other form.
const minEncodedForm = 12

// newRedactor returns the redactor for key, with its encoded forms worked
// out once.
func newRedactor(key string) redactor {
	r := redactor{key: key}
	if key == "" {
		return r
	}
	add := func(text string, b64 bool) {
		if len(text) < minEncodedForm {
			return
		}
		for _, f := range r.forms {
			if string(f.text) == text {
				return
			}
		}
		r.forms = append(r.forms, encodedForm{text: []byte(text), base64: b64})
	}
	h := hex.EncodeToString([]byte(key))
	add(h, false)
	add(strings.ToUpper(h), false)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for align := range 3 {
			// The key after align other bytes: the characters between the
			// first and last that mix in bits from outside the key depend
			// on the key alone.
			e := enc.EncodeToString(append(make([]byte, align), key...))
			form := e[(8*align+5)/6 : 8*(align+len(key))/6]
			add(form, true)
			if strings.ContainsAny(form, "+/") {
				add(strings.NewReplacer("+", "%2B", "/", "%2F").Replace(form), true)
				add(strings.NewReplacer("+", "%2b", "/", "%2f").Replace(form), true)
			}
			// In a JSON text that can't be decoded as a whole (cut short),
			// as some encoders write / in any string.
			if strings.Contains(form, "/") {
				add(strings.ReplaceAll(form, "/", `\/`), true)
			}
		}
	}
	return r
}

// redact returns b without the key. It returns b itself, unchanged and
// without allocating, when b holds neither the key, nor its base64 or hex
// forms, nor any backslash, percent sign or ampersand (the usual reply),
// since then no escaped form can be there.
func (r redactor) redact(b []byte) []byte {
	if r.key == "" || r.clean(b) {
		return b
	}
	if json.Valid(b) {
		b = r.redactJSONStrings(b)
	}
	return r.redactRaw(b)
}

// redactString is redact for error texts.
func (r redactor) redactString(s string) string {
	if r.key == "" || r.cleanString(s) {
		return s
	}
	return string(r.redact([]byte(s)))
}

// clean reports that b cannot hold the key in any form: neither the key
// nor an encoded form of it is there, and nothing in b could be an escape.
func (r redactor) clean(b []byte) bool {
	if bytes.IndexByte(b, '\\') >= 0 || bytes.IndexByte(b, '%') >= 0 || bytes.IndexByte(b, '&') >= 0 || bytes.Contains(b, []byte(r.key)) {
		return false
	}
	for _, f := range r.forms {
		if bytes.Contains(b, f.text) {
			return false
		}
	}
	return true
}

// cleanString is clean for a string, without copying it.
func (r redactor) cleanString(s string) bool {
	if strings.IndexByte(s, '\\') >= 0 || strings.IndexByte(s, '%') >= 0 || strings.IndexByte(s, '&') >= 0 || strings.Contains(s, r.key) {
		return false
	}
	for _, f := range r.forms {
		if strings.Contains(s, string(f.text)) {
			return false
		}
	}
	return true
}

// redactJSONStrings decodes each string token of the JSON document b that
// might hold the key, removes the key from the decoded text (where it may
// be further escaped or percent-encoded), and encodes it again. Other
// tokens are copied byte for byte.
func (r redactor) redactJSONStrings(b []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		j := i + 1
		for j < len(b) && b[j] != '"' {
			if b[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(b) {
			break // not valid JSON after all; the raw pass handles it
		}
		tok := b[i : j+1]
		if !r.clean(tok[1 : len(tok)-1]) {
			var s string
			if json.Unmarshal(tok, &s) == nil {
				if red := r.redactRaw([]byte(s)); !bytes.Equal(red, []byte(s)) {
					out = append(out, b[last:i]...)
					out = appendJSONString(out, red)
					last = j + 1
				}
			}
		}
		i = j
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// appendJSONString appends s as a JSON string, escaping only what JSON
// requires (and invalid UTF-8, as U+FFFD).
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for len(s) > 0 {
		c := s[0]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			s = s[1:]
			continue
		}
		rn, size := utf8.DecodeRune(s)
		if rn == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[:size]...)
		}
		s = s[size:]
	}
	return append(dst, '"')
}

// redactRaw replaces every stretch of b that decodes to the key, in any
// mix of the encodings the redactor knows, with the mark.
func (r redactor) redactRaw(b []byte) []byte {
	if r.clean(b) {
		return b
	}
	var out []byte
	last := 0     // end of what has been copied or replaced
	spanEnd := -1 // end of the stretch being replaced, if any
	spanStart := 0
	for i := 0; i < len(b); i++ {
		if spanEnd >= 0 && i >= spanEnd {
			out = append(out, b[last:spanStart]...)
			out = append(out, redactedMark...)
			last, spanEnd = spanEnd, -1
		}
		c := b[i]
		if c != r.key[0] && c != '%' && c != '\\' && c != '&' {
			continue
		}
		end := r.matchEnd(b, i)
		if end < 0 {
			continue
		}
		if spanEnd < 0 {
			spanStart, spanEnd = i, end
		} else {
			spanEnd = max(spanEnd, end)
		}
	}
	if spanEnd >= 0 {
		out = append(out, b[last:spanStart]...)
		out = append(out, redactedMark...)
		last = spanEnd
	}
	if out != nil {
		b = append(out, b[last:]...)
	}
	return r.redactForms(b)
}

// trimPartial returns b, a text cut short, less any tail that could be the
// first part of the key: some of its bytes in any mix of the forms matchEnd
// reads, perhaps followed by an escape cut in the middle, or the start of
// its hex or base64 form. The rest of such a key was cut off, so redact
// could not find it. The tail is dropped, not marked: b was cut anyway,
// and a few bytes more or less of it say nothing.
func (r redactor) trimPartial(b []byte) []byte {
	if r.key == "" {
		return b
	}
	// Trimming one kind of tail can leave another (an escape cut short
	// after the start of a base64 form), so trim until nothing changes.
	for {
		n := len(b)
		b = r.trimPartialOnce(b)
		if len(b) == n {
			return b
		}
	}
}

func (r redactor) trimPartialOnce(b []byte) []byte {
	for i := max(0, len(b)-maxEncodedByte*len(r.key)); i < len(b); i++ {
		if c := b[i]; (c == r.key[0] || c == '%' || c == '\\' || c == '&') && r.partialAt(b, i) {
			b = b[:i]
			break
		}
	}
	for _, f := range r.forms {
		for n := min(len(f.text)-1, len(b)); n > 0; n-- {
			if !bytes.HasSuffix(b, f.text[:n]) {
				continue
			}
			end := len(b) - n
			if f.base64 && end > 0 && isBase64Char(b[end-1]) {
				// It may carry a few of the key's bits, as in redactForms.
				end--
			}
			b = b[:end]
			break
		}
	}
	return b
}

// partialAt reports whether b[i:] could be the start of the key: it
// decodes to the key's first bytes (at least one), or to some of them
// followed by what may be an escape cut short.
func (r redactor) partialAt(b []byte, i int) bool {
	type state struct{ p, j int }
	stack := []state{{i, 0}}
	seen := map[state]bool{}
	var unitBuf [8]unit
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch {
		case s.p == len(b):
			if s.j > 0 {
				return true
			}
			continue
		case s.j == len(r.key):
			// The whole key, which redact would have removed.
			return true
		case len(b)-s.p < maxEncodedByte && (b[s.p] == '%' || b[s.p] == '\\' || b[s.p] == '&'):
			// An escape, perhaps of the key's next byte, that the cut
			// may have left unfinished.
			return true
		}
		for _, u := range percentUnits(b, s.p, unitBuf[:0]) {
			if !strings.HasPrefix(r.key[s.j:], string(u.bytes())) {
				continue
			}
			if next := (state{u.next, s.j + u.n}); !seen[next] {
				seen[next] = true
				stack = append(stack, next)
			}
		}
	}
	return false
}

// redactForms replaces each encoded form of the key in b with the mark,
// returning b itself when there is none.
func (r redactor) redactForms(b []byte) []byte {
	for _, f := range r.forms {
		i := bytes.Index(b, f.text)
		if i < 0 {
			continue
		}
		var out []byte
		rest := b
		for ; i >= 0; i = bytes.Index(rest, f.text) {
			start, end := i, i+len(f.text)
			if f.base64 {
				if start > 0 && isBase64Char(rest[start-1]) {
					start--
				}
				if end < len(rest) && isBase64Char(rest[end]) {
					end++
				}
				for end < len(rest) && rest[end] == '=' {
					end++
				}
			}
			out = append(out, rest[:start]...)
			out = append(out, redactedMark...)
			rest = rest[end:]
		}
		b = append(out, rest...)
	}
	return b
}

// isBase64Char reports whether c is in either base64 alphabet.
func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '+' || c == '/' || c == '-' || c == '_'
}
