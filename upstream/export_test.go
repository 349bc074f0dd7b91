package upstream

// Hooks for the external tests in package upstream_test.

// RetryAfter is retryAfter, the Retry-After parser.
var RetryAfter = retryAfter

// MaxErrorBody is how much of a non-2xx reply body a StatusError keeps.
const MaxErrorBody = maxErrorBody
