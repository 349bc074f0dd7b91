package inbox

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"

	"example.com/paymentsd/internal/store"
)

var (
	errBusy     = errors.New("the deliveries' byte budget is held")
	errTooLarge = errors.New("body over the limit")
)

// firstRead is the most a body holds before more of it has arrived: most
// deliveries fit.
const firstRead = 4 << 10

// readBody reads r's body, holding its bytes against the deliveries' budget
// as they arrive: a body that trickles in holds only what has come, so slow
// senders can't keep the others out. It returns the body and the bytes it
// holds, to be released once the delivery is answered, even on error.
func (h *Handler) readBody(r *http.Request) (body []byte, held int64, err error) {
	// With a Content-Length the body is read to exactly that; without
	// one, a byte past MaxBytes shows it too large.
	target := h.maxBytes + 1
	if r.ContentLength >= 0 {
		target = r.ContentLength
	}
	grow := func(size int64) bool {
		if !h.bodies.TryAcquire(size - held) {
			return false
		}
		nb := make([]byte, len(body), size)
		copy(nb, body)
		body, held = nb, size
		return true
	}
	if !grow(min(target, firstRead)) {
		return nil, held, errBusy
	}
	for {
		if len(body) == cap(body) {
			if int64(cap(body)) >= target {
				if r.ContentLength >= 0 {
					return body, held, nil
				}
				return nil, held, errTooLarge
			}
			if !grow(min(2*int64(cap(body)), target)) {
				return nil, held, errBusy
			}
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if errors.Is(err, io.EOF) {
			switch {
			case int64(len(body)) > h.maxBytes:
				return nil, held, errTooLarge
			case r.ContentLength >= 0 && int64(len(body)) < r.ContentLength:
				return nil, held, io.ErrUnexpectedEOF
			}
			return body, held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}

// hopByHop are the headers that describe one connection, not the delivery
// (RFC 9110 section 7.6.1), and are not kept.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// headers returns r's headers less hop-by-hop ones, by name in canonical
// form, each name's values in the order received, as bytes. net/http does
// not keep the order of different names, so they are sorted. Host is
// included. A configured token anywhere in a value (a proxy's
// X-Original-URI, say), as written or percent-encoded, is replaced, and so
// is one in a name, in any case.
func (h *Handler) headers(r *http.Request) []store.Header {
	drop := map[string]bool{}
	for _, v := range r.Header.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				drop[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	for _, name := range hopByHop {
		drop[name] = true
	}
	names := make([]string, 0, len(r.Header)+1)
	for name := range r.Header {
		if !drop[name] && !strings.HasPrefix(name, "Proxy-") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]store.Header, 0, len(names)+1)
	if r.Host != "" {
		out = append(out, store.Header{Name: "Host", Value: h.redact(r.Host)})
	}
	for _, name := range names {
		for _, v := range r.Header[name] {
			out = append(out, store.Header{Name: h.redactName(name), Value: h.redact(v)})
		}
	}
	return out
}
