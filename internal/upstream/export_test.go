package upstream

// Hooks for the external tests in package upstream_test.

// RetryAfter is retryAfter, the Retry-After parser.
var RetryAfter = retryAfter

// MaxErrorBody is how much of a non-2xx reply body a StatusError keeps.
const MaxErrorBody = maxErrorBody

// MaxEncodedKeyByte is how far past MaxErrorBody the client reads, per byte
// of the key.
const MaxEncodedKeyByte = maxEncodedKeyByte

// Redact is the client's redaction of key from b.
func Redact(key string, b []byte) []byte { return newRedactor(key).redact(b) }

// Redactor is the client's redaction of key, with its encoded forms worked
// out once, as the client does.
func Redactor(key string) func([]byte) []byte { return newRedactor(key).redact }
