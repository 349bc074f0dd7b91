package inbox

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ValidateToken reports what is wrong with a token, without the token.
func ValidateToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("a token has %d characters, want at least %d", len(tok), MinTokenLength)
	}
	for i := 0; i < len(tok); i++ {
		if !unreserved(tok[i]) {
			return fmt.Errorf("a token has a character other than A-Z, a-z, 0-9, '-', '.', '_' and '~' at position %d", i+1)
		}
	}
	return nil
}

// unreserved reports whether c is an RFC 3986 unreserved character, which
// reads the same in a URL escaped or not.
func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// tokenSet is the tokens accepted, as hashes, and the tokens redact
// removes: those accepted and those accepted before, whose deliveries the
// provider may still be retrying.
type tokenSet struct {
	sums   [][sha256.Size]byte
	redact []string
	folded []string // redact in lower case, for redactName
}

// SetTokens replaces the accepted tokens: one, or two while the
// provider's dashboard is switched from an old token to a new one.
// Deliveries under way finish with the tokens they started with. Tokens
// accepted before are still redacted wherever they turn up. The error
// never quotes a token.
func (h *Handler) SetTokens(tokens []string) error {
	switch {
	case len(tokens) == 0 || len(tokens) > 2:
		return fmt.Errorf("inbox: %d tokens, want 1 or 2", len(tokens))
	case len(tokens) == 2 && tokens[0] == tokens[1]:
		return errors.New("inbox: the same token twice")
	}
	next := &tokenSet{}
	for _, tok := range tokens {
		if err := ValidateToken(tok); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		next.sums = append(next.sums, sha256.Sum256([]byte(tok)))
		next.redact = append(next.redact, tok)
	}
	h.tokenMu.Lock()
	defer h.tokenMu.Unlock()
	if old := h.tokens.Load(); old != nil {
		for _, tok := range old.redact {
			if !slices.Contains(next.redact, tok) {
				next.redact = append(next.redact, tok)
			}
		}
	}
	// Two rotations back is long enough for the provider's retries.
	next.redact = next.redact[:min(len(next.redact), 6)]
	for _, tok := range next.redact {
		next.folded = append(next.folded, strings.ToLower(tok))
	}
	h.tokens.Store(next)
	if m := h.metrics; m != nil {
		for i := range next.sums {
			for _, o := range []string{OutcomeStored, OutcomeDuplicate, OutcomeTooLarge, OutcomeStoreFailure, OutcomeBadMethod, OutcomeBadRequest, OutcomeBusy, OutcomeOverQuota} {
				m.deliveries.WithLabelValues(o, tokenLabel(i))
			}
		}
	}
	return nil
}

// tokenLabel names the i'th configured token.
func tokenLabel(i int) string {
	switch i {
	case 0:
		return TokenFirst
	case 1:
		return TokenSecond
	}
	return TokenNone
}

// match compares tok with every configured token in constant time and
// returns the index of the one it is, or -1: both sides are hashed first,
// so neither the comparison nor its length says anything about a
// configured token.
func (h *Handler) match(tok string) int {
	sum := sha256.Sum256([]byte(tok))
	found := -1
	for i, want := range h.tokens.Load().sums {
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			found = i
		}
	}
	return found
}
