package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
)

// maxLoggedKey is how much of an idempotency key a log line carries: keys
// have no documented length limit, and one line must not carry 60 KB.
const maxLoggedKey = 64

// AppendKey appends the log attributes that name an idempotency key: a
// bounded prefix of it, and a short hash of the whole key that tells apart
// keys sharing a prefix. Every line about a key names it so, so that one
// grep finds them all.
func AppendKey(attrs []slog.Attr, key string) []slog.Attr {
	if key == "" {
		return append(attrs, slog.String("idempotency_key", ""))
	}
	sum := sha256.Sum256([]byte(key))
	logged := key
	if len(logged) > maxLoggedKey {
		logged = strings.ToValidUTF8(logged[:maxLoggedKey], "")
	}
	return append(attrs,
		slog.String("idempotency_key", logged),
		slog.String("idempotency_key_sha256", hex.EncodeToString(sum[:6])),
	)
}

// keyAttrs are log arguments naming key, then more.
func keyAttrs(key string, more ...slog.Attr) []any {
	var attrs []any
	for _, a := range AppendKey(nil, key) {
		attrs = append(attrs, a)
	}
	for _, a := range more {
		attrs = append(attrs, a)
	}
	return attrs
}
