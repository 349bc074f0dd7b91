package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// CreateMultiCardPayment asks the provider to create a payment. Every
// request carries p.IdempotencyKey and the same body. A request that never
// reached the provider (the connection could not be made), a 2xx whose
// reply was cut off, and a 429 are retried, with backoff, while the next
// wait fits in the context's deadline. A request that may still be at the
// provider (see Error.AtProvider: any other status, or none) is never
// followed by another: the two would be at the provider at once with one
// key. A 401 or 403 with the API key in use is sent once more, at once,
// with the other key if the client holds two (see Config.APIKeys); that
// request counts like any other. On failure the error is an *Error.
func (c *Client) CreateMultiCardPayment(ctx context.Context, p Payment) (*Reply, error) {
	body, err := EncodeRequest(p)
	if err != nil {
		return nil, &Error{Err: err}
	}
	return c.Send(ctx, body)
}

// Send is CreateMultiCardPayment with a body already encoded by
// EncodeRequest, sent byte for byte: the way to re-send a recorded request
// with its idempotency key.
func (c *Client) Send(ctx context.Context, body []byte) (*Reply, error) {
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}

	failure := &Error{}
	// switched is the key a request was re-sent with after the key in
	// use was refused; refused, the key that was. From then on the call
	// keeps the set it switched in, so that the key it sends is always
	// one the set redacts, even if a reload drops it.
	var switched, refused string
	var keys *keySet
	for {
		key := switched
		if switched == "" {
			keys = c.keys.Load()
			key = keys.current()
		}
		done, err := c.breaker.Allow()
		if err != nil {
			c.metrics.observe(outcomeCircuitOpen, 0)
			if failure.Requests == 0 {
				var left time.Duration
				if until := c.openUntil.Load(); until != nil {
					left = max(time.Until(*until), 0)
				}
				failure.Err = &CircuitOpenError{RetryAfter: left}
			}
			return nil, failure
		}
		failure.Requests++
		if failure.Requests > 1 {
			c.metrics.retry()
		}
		failure.LastRequestStart = time.Now()
		reply, sent, answered, err := c.request(ctx, body, keys, key)
		done(breakerVerdict(err))
		if switched != "" && answered && !authRefusal(err) {
			c.promote(switched, refused)
		}
		if err == nil {
			reply.Requests = failure.Requests
			return reply, nil
		}
		failure.Err = err
		failure.MaybeCreated = failure.MaybeCreated || maybeCreated(err, sent)
		failure.AtProvider = sent && (!answered || mayStillBeWorkedOn(err))
		if other, ok := keys.other(key); ok && switched == "" && authRefusal(err) {
			// A 401 or 403 is a refusal before any work: nothing was
			// created and the provider is done with the request, so the
			// other key may be tried at once, once.
			c.logRequest(ctx, keys, failure.Requests, err, sent, "0s: with the other API key")
			switched, refused = other, key
			continue
		}
		switch {
		case failure.AtProvider:
			c.logRequest(ctx, keys, failure.Requests, err, sent, "none: the request may still be at the provider")
			return nil, failure
		case !retryable(err) || failure.Requests >= c.cfg.MaxRequests:
			c.logRequest(ctx, keys, failure.Requests, err, sent, "none")
			return nil, failure
		}
		wait := c.backoff(failure.Requests, err)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			c.logRequest(ctx, keys, failure.Requests, err, sent, "none: the deadline is too near")
			return nil, failure
		}
		c.logRequest(ctx, keys, failure.Requests, err, sent, wait.String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			failure.Err = ctx.Err()
			return nil, failure
		case <-t.C:
		}
	}
}

// logRequest logs a failed request with its real cause: the provider's
// status, or the transport's own error text (which names a DNS failure, a
// refused connection, a certificate problem or an invalid header value,
// where the caller-facing error says only "unreachable").
func (c *Client) logRequest(ctx context.Context, keys *keySet, n int, err error, sent bool, retry string) {
	if c.logger == nil || !c.logger.Enabled(ctx, slog.LevelWarn) {
		return
	}
	attrs := []slog.Attr{
		slog.Int("attempt", n),
		slog.Bool("request_sent", sent),
		slog.String("retry_in", retry),
	}
	var se *StatusError
	if errors.As(err, &se) {
		attrs = append(attrs, slog.Int("provider_status", se.Status))
	} else {
		attrs = append(attrs, slog.String("outcome", transportLabel(err)))
	}
	attrs = append(attrs, slog.String("cause", keys.redactString(causeOf(err).Error())))
	c.logger.LogAttrs(ctx, slog.LevelWarn, "provider attempt failed", attrs...)
}

// request makes one request. sent reports that the whole request was
// written, so the provider may have acted on it; answered, that a status
// came back, so the provider is done with it.
func (c *Client) request(ctx context.Context, body []byte, keys *keySet, key string) (_ *Reply, sent, answered bool, _ error) {
	st := &requestState{}
	st.body.Reset(body)
	st.trace = httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			st.connected.Store(true)
			if !info.Reused {
				c.metrics.connOpened()
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				st.wrote.Store(true)
			}
		},
	}
	// As http.NewRequestWithContext makes it, from the URL parsed once and
	// the key's header. Without GetBody the transport can't re-send the
	// request on its own (HTTP/2 does, after some stream errors and
	// GOAWAYs): every request the provider may see is a request this
	// client counts and judges.
	req := (&http.Request{
		Method:     http.MethodPost,
		URL:        c.target,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     keys.header(key, c.cfg.UserAgent),
		// A body net/http knows is in memory: it writes the header and
		// the body together.
		Body:          io.NopCloser(&st.body),
		ContentLength: int64(len(body)),
		Host:          c.target.Host,
	}).WithContext(httptrace.WithClientTrace(ctx, &st.trace))

	start := time.Now()
	c.metrics.start()
	defer c.metrics.end()
	resp, err := c.http.Do(req)
	if err != nil {
		// A request cut off by the context once it had a connection may
		// have been written whole just as the context ended, before the
		// transport reported it: it may be at the provider.
		sent := st.wrote.Load() || (ctx.Err() != nil && st.connected.Load())
		err = c.transportError(ctx, keys, err, sent)
		c.metrics.observe(transportLabel(err), time.Since(start))
		return nil, sent, false, err
	}
	reply, err := c.readReply(ctx, keys, resp)
	c.metrics.observe(strconv.Itoa(resp.StatusCode), time.Since(start))
	return reply, true, true, err
}

// requestState is one request's: its body, and what its trace learns.
type requestState struct {
	wrote, connected atomic.Bool
	trace            httptrace.ClientTrace
	body             bytes.Reader
}

// backoff returns how long to wait before the request after the n-th: the
// provider's Retry-After if it sent one, else exponential backoff with full
// jitter.
func (c *Client) backoff(n int, err error) time.Duration {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter
	}
	ceiling := c.cfg.BackoffBase << (n - 1)
	if ceiling > c.cfg.BackoffMax || ceiling <= 0 {
		ceiling = c.cfg.BackoffMax
	}
	return rand.N(ceiling) + 1
}

// retryAfter parses a Retry-After value, in seconds or as an HTTP date,
// capped at limit.
func retryAfter(v string, now time.Time, limit time.Duration) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := parseSeconds(v); err == nil {
		d = secs
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), limit)
}

func parseSeconds(v string) (time.Duration, error) {
	// RFC 9110 delay-seconds: 1*DIGIT, so "01" is one second, and a number
	// too big for ParseInt is a long wait.
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, errors.New("not seconds")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > int64(time.Hour/time.Second) {
		n = int64(time.Hour / time.Second)
	}
	return time.Duration(n) * time.Second, nil
}
