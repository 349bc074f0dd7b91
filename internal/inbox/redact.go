package inbox

import (
	"encoding/hex"
	"slices"
	"strings"
)

// redactRounds is how many layers of percent-encoding redact sees
// through: %61, and %2561 (the % itself encoded), and once more.
const redactRounds = 3

// redact replaces every configured token in v with [REDACTED]: as written,
// and percent-encoded in whole or in part, up to redactRounds times over.
// Tokens are at least 32 random characters, so anywhere one appears it is
// the token, whatever precedes it.
func (h *Handler) redact(v string) string {
	return redactTokens(v, h.tokens.Load().redact)
}

// redactName is redact for a header's name, which net/http has put in
// canonical form (X-Abc-Def for x-aBC-dEF): a token there may differ from
// the configured one in case alone, so it is found whatever its case.
func (h *Handler) redactName(name string) string {
	lower := strings.ToLower(name)
	if r := redactTokens(lower, h.tokens.Load().folded); r != lower {
		return r
	}
	return name
}

// redactTokens replaces every one of toks in v, as redact describes.
func redactTokens(v string, toks []string) string {
	if len(v) < MinTokenLength {
		return v
	}
	// view is v decoded some number of times; from[i] and to[i] are the
	// bytes of v that its i'th byte came from.
	view := []byte(v)
	from, to := make([]int, len(v)), make([]int, len(v))
	for i := range v {
		from[i], to[i] = i, i+1
	}
	var spans [][2]int // bytes of v to replace
	for round := 0; ; round++ {
		for _, tok := range toks {
			for off := 0; ; {
				i := strings.Index(string(view[off:]), tok)
				if i < 0 {
					break
				}
				i += off
				spans = append(spans, [2]int{from[i], to[i+len(tok)-1]})
				off = i + len(tok)
			}
		}
		if round == redactRounds || strings.IndexByte(string(view), '%') < 0 {
			break
		}
		view, from, to = percentDecode(view, from, to)
	}
	if len(spans) == 0 {
		return v
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	var b strings.Builder
	at := 0 // v[:at] is written
	for _, s := range spans {
		if s[1] <= at {
			continue // inside one already replaced
		}
		if s[0] >= at {
			b.WriteString(v[at:s[0]])
			b.WriteString("[REDACTED]")
		}
		at = s[1]
	}
	b.WriteString(v[at:])
	return b.String()
}

// percentDecode decodes each well-formed %XX in view once, keeping for
// every byte of the result the span of the original it came from.
func percentDecode(view []byte, from, to []int) ([]byte, []int, []int) {
	out := make([]byte, 0, len(view))
	nf, nt := make([]int, 0, len(view)), make([]int, 0, len(view))
	for i := 0; i < len(view); i++ {
		if view[i] == '%' && i+2 < len(view) {
			var c [1]byte
			if _, err := hex.Decode(c[:], view[i+1:i+3]); err == nil {
				out = append(out, c[0])
				nf, nt = append(nf, from[i]), append(nt, to[i+2])
				i += 2
				continue
			}
		}
		out = append(out, view[i])
		nf, nt = append(nf, from[i]), append(nt, to[i])
	}
	return out, nf, nt
}
