package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

// Reply is the provider's answer to a payment that succeeded.
type Reply struct {
	// Status is the provider's 2xx status.
	Status int
	// Body is the reply body exactly as received (key redacted): a JSON
	// object that DecodeReply accepts. Payment decodes it.
	Body []byte
	// Requests is how many requests were sent, counting the first.
	Requests int
}

// readReply turns a response into a Reply or an error, and always closes
// the body, draining what is left of it (up to the limit) so the connection
// can be reused.
func (c *Client) readReply(ctx context.Context, keys *keySet, resp *http.Response) (*Reply, error) {
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, c.cfg.MaxResponseBytes))
		resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Read past the limit by the longest encoding of the key, so that
		// a key across the cut is redacted whole rather than left in part.
		limit := maxErrorBody + int64(maxEncodedKeyByte*keys.longest)
		b, _ := io.ReadAll(io.LimitReader(resp.Body, limit))
		cut := int64(len(b)) == limit // the body may go on
		b = keys.redact(b)
		if len(b) > maxErrorBody {
			b, cut = b[:maxErrorBody], true
		}
		if cut {
			// A key that starts just before the end of what was read
			// (which redacting keys before it may have brought under
			// the limit) was not seen whole: drop its first part.
			b = keys.trimPartial(b)
		}
		return nil, &StatusError{
			Status:     resp.StatusCode,
			Body:       b,
			RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now(), c.cfg.MaxRetryAfter),
		}
	}
	b, err := readAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1), resp.ContentLength, c.cfg.MaxResponseBytes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: reading %d reply: %v", ErrConnectionLost, resp.StatusCode, err)
	}
	if int64(len(b)) > c.cfg.MaxResponseBytes {
		return nil, fmt.Errorf("%w: %d reply over %d bytes", ErrReplyTooLarge, resp.StatusCode, c.cfg.MaxResponseBytes)
	}
	// Redact before checking, so that Payment, decoded from the redacted
	// body, holds the key nowhere either.
	b = keys.redact(b)
	// The reply is judged here as DecodeReply judges it, but the Struct is
	// built only for a caller that wants one (Payment): a REST caller gets
	// the exact bytes and never needs it.
	if err := CheckReply(b); err != nil {
		return nil, err
	}
	return &Reply{Status: resp.StatusCode, Body: b}, nil
}

// readAll is io.ReadAll of r, into a buffer sized for the reply when its
// length (n, -1 if unknown) is known and at most max: the reply is kept
// (in the record, and by the outbox for a while after it is written), and
// io.ReadAll's growing buffer would hold up to twice its size (a 300-byte
// reply in 512 bytes), and copy a longer one several times over.
func readAll(r io.Reader, n, max int64) ([]byte, error) {
	if n < 0 || n > max {
		return io.ReadAll(r)
	}
	// One byte more, so that the end of the body is read without growing
	// the buffer; a body longer than it said still grows it, and is read
	// whole (up to the limit).
	b := make([]byte, 0, n+1)
	for {
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// Payment is the reply body as a Struct. Numbers in it are doubles; Body
// is exact. The body has passed CheckReply, so DecodeReply accepts it; were
// it ever to refuse it, Payment would be nil.
func (r *Reply) Payment() *structpb.Struct {
	p, _ := DecodeReply(r.Body)
	return p
}

// CheckReply returns the error DecodeReply would return for b, without
// decoding it. DecodeReply refuses b exactly when it is not valid UTF-8,
// not valid JSON (json.Unmarshal checks the whole of b with the scanner
// json.Valid uses, depth limit included), not an object (null included),
// or holds a number that overflows a float64: those are the only ways
// json.Unmarshal into a map[string]any can fail on valid JSON, and
// structpb.NewStruct never fails on what that gives. FuzzCheckReply
// checks that the two agree.
func CheckReply(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("%w (%d bytes): invalid UTF-8", ErrMalformedReply, len(b))
	}
	if !json.Valid(b) || !isObject(b) || !numbersFit(b) {
		return fmt.Errorf("%w (%d bytes)", ErrMalformedReply, len(b))
	}
	return nil
}

// isObject reports whether valid JSON b is an object.
func isObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c == '{'
	}
	return false
}

// numbersFit reports whether every number in valid JSON b parses as a
// float64 without overflow, as json.Unmarshal into an any requires.
func numbersFit(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			// Skip the string; b is valid JSON, so it ends.
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case c == '-' || ('0' <= c && c <= '9'):
			j := i + 1
			for j < len(b) && isNumberByte(b[j]) {
				j++
			}
			if _, err := strconv.ParseFloat(string(b[i:j]), 64); err != nil {
				return false
			}
			i = j - 1
		}
	}
	return true
}

func isNumberByte(c byte) bool {
	return ('0' <= c && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// DecodeReply decodes a 2xx reply body, which must be a JSON object.
// encoding/json then structpb is about twice as fast as protojson here, and
// gives the same Struct for every valid JSON object without duplicate keys
// (where protojson refuses the reply and this keeps the last value).
// Invalid UTF-8 is refused rather than silently replaced.
func DecodeReply(b []byte) (*structpb.Struct, error) {
	var m map[string]any
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w (%d bytes): invalid UTF-8", ErrMalformedReply, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		// The decoder's message quotes part of the body, which is the
		// provider's and harmless, but keep the error short and stable.
		return nil, fmt.Errorf("%w (%d bytes)", ErrMalformedReply, len(b))
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("%w (%d bytes): %v", ErrMalformedReply, len(b), err)
	}
	return s, nil
}
