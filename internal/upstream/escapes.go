package upstream

import (
	"bytes"
	"html"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// unit is one character as a reader may decode it: its bytes, and where
// the next one starts.
type unit struct {
	b    [utf8.UTFMax]byte
	n    int
	next int
}

func (u unit) bytes() []byte { return u.b[:u.n] }

// matchEnd returns the end of the longest stretch of b starting at i that
// decodes to the key, or -1. Each character of the key may be written
// plainly, JSON-escaped or percent-encoded, so the search follows every
// reading at once; the states (position, characters matched) are few and
// each is visited once.
func (r redactor) matchEnd(b []byte, i int) int {
	type state struct{ p, j int }
	var stackBuf [8]state
	stack := append(stackBuf[:0], state{i, 0})
	var seen map[state]bool // only when readings branch
	var unitBuf [8]unit
	best := -1
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if s.j == len(r.key) {
			best = max(best, s.p)
			continue
		}
		units := percentUnits(b, s.p, unitBuf[:0])
		for _, u := range units {
			if !strings.HasPrefix(r.key[s.j:], string(u.bytes())) {
				continue
			}
			next := state{u.next, s.j + u.n}
			if len(units) > 1 || seen != nil {
				if seen == nil {
					seen = make(map[state]bool)
				}
				if seen[next] {
					continue
				}
				seen[next] = true
			}
			stack = append(stack, next)
		}
	}
	return best
}

// percentUnits appends the readings of the character at b[p]: the JSON
// readings, an HTML character reference, and a percent-encoded byte whose
// %, and hex digits, may each be JSON-escaped.
func percentUnits(b []byte, p int, out []unit) []unit {
	out = jsonUnits(b, p, out)
	if u, ok := htmlUnit(b, p); ok {
		out = append(out, u)
	}
	n := len(out)
	for k := 0; k < n; k++ {
		if out[k].n != 1 || out[k].b[0] != '%' {
			continue
		}
		hi, q, ok := hexUnit(b, out[k].next)
		if !ok {
			continue
		}
		lo, q, ok := hexUnit(b, q)
		if !ok {
			continue
		}
		out = append(out, unit{b: [utf8.UTFMax]byte{hi<<4 | lo}, n: 1, next: q})
	}
	return out
}

// htmlUnit reads an HTML character reference at b[p]: &#DDD; or &#xHH;
// (the semicolon optional, as browsers read them), or a named one such as
// &sol; or &lowbar;.
func htmlUnit(b []byte, p int) (unit, bool) {
	if p+2 >= len(b) || b[p] != '&' {
		return unit{}, false
	}
	var rn rune
	q := p + 1
	if b[q] == '#' {
		q++
		base := 10
		if q < len(b) && (b[q] == 'x' || b[q] == 'X') {
			base, q = 16, q+1
		}
		start := q
		for ; q < len(b) && q-start < maxRefDigits; q++ {
			d, ok := hexVal(b[q])
			if !ok || int(d) >= base {
				break
			}
			rn = rn*rune(base) + rune(d)
		}
		if q == start || !utf8.ValidRune(rn) {
			return unit{}, false
		}
		if q < len(b) && b[q] == ';' {
			q++
		}
	} else {
		end := bytes.IndexByte(b[q:min(len(b), q+maxEntityName+1)], ';')
		if end <= 0 {
			return unit{}, false
		}
		ref := string(b[p : q+end+1])
		text := html.UnescapeString(ref)
		if text == ref || len(text) > utf8.UTFMax {
			return unit{}, false
		}
		var u unit
		u.n = copy(u.b[:], text)
		u.next = q + end + 1
		return u, true
	}
	var u unit
	u.n = utf8.EncodeRune(u.b[:], rn)
	u.next = q
	return u, true
}

// maxEntityName is longer than any HTML named character reference.
const maxEntityName = 32

// maxRefDigits is the most digits a numeric character reference may have.
const maxRefDigits = 8

// Lengths of the longest forms the decoder above reads, worked out from
// its own limits, so that a reader that must take in a whole key (the
// error body's cut) knows how far to read.
const (
	jsonEscapeLen = len(`\u0000`)
	// maxUnitLen: a JSON escape, a surrogate pair, a numeric or a named
	// character reference.
	maxUnitLen = max(jsonEscapeLen, 2*jsonEscapeLen, len("&#x")+maxRefDigits+len(";"), len("&")+maxEntityName+len(";"))
	// maxEncodedByte is a percent-encoded byte whose % is read as any unit
	// and whose hex digits are JSON-escaped: &#x00000025;\u0036\u0043 is
	// an "l". No form of a byte is longer.
	maxEncodedByte = maxUnitLen + 2*jsonEscapeLen
)

// hexUnit reads one hex digit at b[p], plain or JSON-escaped.
func hexUnit(b []byte, p int) (byte, int, bool) {
	var buf [4]unit
	for _, u := range jsonUnits(b, p, buf[:0]) {
		if u.n == 1 {
			if v, ok := hexVal(u.b[0]); ok {
				return v, u.next, true
			}
		}
	}
	return 0, 0, false
}

// jsonUnits appends the readings of the character at b[p]: the byte
// itself, and, where a backslash starts a JSON escape, what it stands for.
func jsonUnits(b []byte, p int, out []unit) []unit {
	if p >= len(b) {
		return out
	}
	out = append(out, unit{b: [utf8.UTFMax]byte{b[p]}, n: 1, next: p + 1})
	if b[p] != '\\' || p+1 >= len(b) {
		return out
	}
	switch c := b[p+1]; c {
	case '"', '\\', '/':
		return append(out, unit{b: [utf8.UTFMax]byte{c}, n: 1, next: p + 2})
	case 'b', 'f', 'n', 'r', 't':
		return append(out, unit{b: [utf8.UTFMax]byte{shortEscape(c)}, n: 1, next: p + 2})
	case 'u':
		r1, ok := hex4(b, p+2)
		if !ok {
			return out
		}
		rn, next := rune(r1), p+6
		if utf16.IsSurrogate(rn) {
			if r2, ok := hex4(b, p+8); ok && p+7 < len(b) && b[p+6] == '\\' && b[p+7] == 'u' {
				if c := utf16.DecodeRune(rn, rune(r2)); c != utf8.RuneError {
					rn, next = c, p+12
				}
			}
		}
		var u unit
		u.n = utf8.EncodeRune(u.b[:], rn)
		u.next = next
		return append(out, u)
	}
	return out
}

// shortEscape is the control character a JSON escape letter stands for.
func shortEscape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	}
	return '\t'
}

func hex4(b []byte, p int) (uint16, bool) {
	if p+4 > len(b) {
		return 0, false
	}
	var v uint16
	for _, c := range b[p : p+4] {
		d, ok := hexVal(c)
		if !ok {
			return 0, false
		}
		v = v<<4 | uint16(d)
	}
	return v, true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
