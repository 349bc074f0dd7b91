package upstream

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
)

// Fingerprint names a key without revealing it: the first 8 hex characters
// of its SHA-256. It is what logs and metrics show of the key in use.
func Fingerprint(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:4])
}

// keySet is the keys the client holds, one or two while a key is rotated,
// and which of them requests carry first. A set is never changed: the
// client swaps whole sets, so a call sees one consistent set.
type keySet struct {
	keys  []string
	inUse int
	reds  []redactor
	// headers are the requests' headers, one for each key: requests only
	// read them (an http.RoundTripper must not change its request), so
	// every request with a key shares its header.
	headers []http.Header
	// longest is the length of the longest key, which bounds how far past
	// a cut an encoded key can reach.
	longest int
}

func newKeySet(keys []string, inUse int, userAgent string) *keySet {
	s := &keySet{keys: keys, inUse: inUse}
	for _, k := range keys {
		s.reds = append(s.reds, newRedactor(k))
		s.headers = append(s.headers, requestHeader(k, userAgent))
		s.longest = max(s.longest, len(k))
	}
	return s
}

// requestHeader is the header of a request with key.
func requestHeader(key, userAgent string) http.Header {
	h := http.Header{
		"X-Api-Key":    {key},
		"Content-Type": {"application/json"},
		"Accept":       {"application/json"},
	}
	if userAgent != "" {
		h["User-Agent"] = []string{userAgent}
	}
	return h
}

// header is the header of a request with key, one of the set's.
func (s *keySet) header(key, userAgent string) http.Header {
	if i := slices.Index(s.keys, key); i >= 0 {
		return s.headers[i]
	}
	return requestHeader(key, userAgent)
}

// checkKeys reports what is wrong with a set of keys, never quoting them.
func checkKeys(keys []string) error {
	switch {
	case len(keys) == 0:
		return errors.New("no API key")
	case len(keys) > 2:
		return fmt.Errorf("%d API keys, want one, or two while rotating", len(keys))
	case slices.Contains(keys, ""):
		return errors.New("an empty API key")
	case len(keys) == 2 && keys[0] == keys[1]:
		return errors.New("the same API key twice")
	}
	return nil
}

func (s *keySet) current() string { return s.keys[s.inUse] }

// other is the key that is not key, if the set holds two.
func (s *keySet) other(key string) (string, bool) {
	for _, k := range s.keys {
		if k != key {
			return k, true
		}
	}
	return "", false
}

// redact removes every key of the set from b.
func (s *keySet) redact(b []byte) []byte {
	for _, r := range s.reds {
		b = r.redact(b)
	}
	return b
}

func (s *keySet) redactString(v string) string {
	for _, r := range s.reds {
		v = r.redactString(v)
	}
	return v
}

// trimPartial drops a tail of b, a text cut short, that could be the start
// of any key of the set.
func (s *keySet) trimPartial(b []byte) []byte {
	for {
		n := len(b)
		for _, r := range s.reds {
			b = r.trimPartial(b)
		}
		if len(b) == n {
			return b
		}
	}
}

// SetKeys replaces the client's keys with keys: one, or two while
// rotating, the one to use first first. If the key in use is among them
// it stays in use (it may be the second, after the first was refused);
// otherwise the first is. Calls under way finish with the keys they
// started with. The error never quotes a key.
func (c *Client) SetKeys(keys []string) error {
	if err := checkKeys(keys); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	keys = slices.Clone(keys)
	for {
		old := c.keys.Load()
		inUse := max(0, slices.Index(keys, old.current()))
		if c.keys.CompareAndSwap(old, newKeySet(keys, inUse, c.cfg.UserAgent)) {
			c.keysChanged()
			return nil
		}
	}
}

// Keys returns the fingerprints of the keys the client holds, in the order
// given, and that of the key in use.
func (c *Client) Keys() (loaded []string, inUse string) {
	s := c.keys.Load()
	for _, k := range s.keys {
		loaded = append(loaded, Fingerprint(k))
	}
	return loaded, Fingerprint(s.current())
}

// promote makes key the key in use, if the client still holds it: another
// key was refused and key was not.
func (c *Client) promote(key string, refused string) {
	for {
		old := c.keys.Load()
		i := slices.Index(old.keys, key)
		if i < 0 || i == old.inUse {
			return // reloaded without it, or another call promoted it
		}
		if c.keys.CompareAndSwap(old, newKeySet(old.keys, i, c.cfg.UserAgent)) {
			if c.logger != nil {
				c.logger.Warn("provider API key switched: the provider refused the key in use (401 or 403) and accepted the other",
					slog.String("api_key_in_use", Fingerprint(key)),
					slog.String("api_key_refused", Fingerprint(refused)))
			}
			c.keysChanged()
			return
		}
	}
}

// keysChanged brings the key metric up to date with the set held now,
// whichever change got there first.
func (c *Client) keysChanged() {
	if c.metrics == nil {
		return
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	s := c.keys.Load()
	c.metrics.setKeys(s)
}
