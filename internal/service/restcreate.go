package service

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// serveCreate is CreateMultiCardPayment's REST handler. NewServer
// routes POST /v1/multi-card-payments to it straight from the HTTP port's
// mux, with the gateway mux's middleware (requireJSON); and registers it on
// the gateway's mux after the generated handlers, for the paths only that
// mux matches (a path not in its plain encoding, or with tracing on), so
// that the mux routes them to it rather than to the generated one. It does what the
// generated handler does, with the gateway's own parts: the marshalers the
// mux picks for the request (restJSON: its decoder reads the body,
// decodeCreate in the shape callers send), the mux's error handler
// (restError) and runtime.ForwardResponseMessage with the mux's
// forward-response options (markReplayed), so the REST call, its answer
// and its refusals are the gateway's as before. What it leaves out is
// the gRPC metadata the generated handler builds from the request's
// headers (runtime.AnnotateIncomingContext: every permanent header and
// Grpc-Metadata- header, X-Forwarded-Host and -For), then copies and
// joins twice with the call's response header, none of which the service
// reads: the one header it reads, X-Request-Id, reaches newCallInfo in the
// gatewayCall. The headers that made the generated handler refuse a call
// still do, with its words: a Grpc-Timeout it can't read, and a binary
// (-Bin) metadata header that is not base64 (restHeaders). A Grpc-Timeout
// is the call's deadline, as before.
func (c *chained) serveCreate(mux *runtime.ServeMux) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		// r's context ends when this returns (net/http cancels it), so no
		// context of its own is needed for that, unlike the generated
		// handler's.
		ctx := r.Context()
		inbound, outbound := runtime.MarshalerForRequest(mux, r)
		timeout, err := restHeaders(r)
		if err != nil {
			runtime.HTTPError(ctx, mux, outbound, w, r, err)
			return
		}
		if timeout != 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		req := new(paymentsv1.CreateMultiCardPaymentRequest)
		var resp *paymentsv1.CreateMultiCardPaymentResponse
		if err = inbound.NewDecoder(r.Body).Decode(req); err != nil && !errors.Is(err, io.EOF) {
			err = status.Errorf(codes.InvalidArgument, "%v", err)
		} else {
			resp, err = c.CreateMultiCardPayment(ctx, req)
		}
		// The call's server metadata, empty, as the generated handler
		// gives it: the gateway's error handler reads it (and logs its
		// absence), and its writer of an answer chunks one to a request
		// with TE: trailers only when there is some; without TE: trailers
		// an empty one changes nothing, and is left out.
		if err != nil || acceptsTrailers(r) {
			ctx = runtime.NewServerMetadataContext(ctx, runtime.ServerMetadata{})
		}
		if err != nil {
			runtime.HTTPError(ctx, mux, outbound, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(ctx, mux, outbound, w, r, resp, mux.GetForwardResponseOptions()...)
	}
}

// acceptsTrailers reports whether r accepts trailers, as the gateway
// reads its TE header.
func acceptsTrailers(r *http.Request) bool {
	return strings.Contains(strings.ToLower(r.Header.Get("TE")), "trailers")
}

// restIncomingHeader is the gateway's incoming header matcher
// (runtime.WithIncomingHeaderMatcher): the gRPC metadata key a REST
// request's header becomes, if any. X-Request-Id keeps its name, as over
// gRPC; the rest as the gateway's default has it.
func restIncomingHeader(h string) (string, bool) {
	if http.CanonicalHeaderKey(h) == "X-Request-Id" {
		return RequestIDHeader, true
	}
	return runtime.DefaultHeaderMatcher(h)
}

// restHeaders reads r's headers as runtime.AnnotateIncomingContext does,
// without building the metadata: the call's Grpc-Timeout (0 without one,
// or runtime.DefaultContextTimeout), and the refusal it makes of a
// Grpc-Timeout it can't read or of a binary metadata header (one the
// matcher maps, whose name ends in -Bin) that is not base64.
func restHeaders(r *http.Request) (time.Duration, error) {
	timeout := runtime.DefaultContextTimeout
	if tm := r.Header.Get("Grpc-Timeout"); tm != "" {
		var err error
		if timeout, err = timeoutDecode(tm); err != nil {
			return 0, status.Errorf(codes.InvalidArgument, "invalid grpc-timeout: %s", tm)
		}
	}
	for key, vals := range r.Header {
		key = textproto.CanonicalMIMEHeaderKey(key)
		if !strings.HasSuffix(key, "-Bin") || key == "X-Forwarded-For" || key == "X-Forwarded-Host" {
			continue
		}
		h, ok := restIncomingHeader(key)
		if !ok || strings.EqualFold(h, "X-Forwarded-For") || strings.EqualFold(h, "X-Forwarded-Host") || !validMetadataKey(h) {
			continue
		}
		for _, v := range vals {
			if _, err := decodeBinHeader(v); err != nil {
				return 0, status.Errorf(codes.InvalidArgument, "invalid binary header %s: %s", key, err)
			}
		}
	}
	return timeout, nil
}

// validMetadataKey is the gateway's test of a metadata key: 0-9 a-z A-Z
// _ - . only.
func validMetadataKey(key string) bool {
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// decodeBinHeader is the gateway's reading of a binary header: base64,
// padded or not.
func decodeBinHeader(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// timeoutDecode reads a Grpc-Timeout as the gateway does: digits and a
// unit (H, M, S, m, u, n); one too long for a time.Duration is the
// longest.
func timeoutDecode(s string) (time.Duration, error) {
	size := len(s)
	if size < 2 {
		return 0, fmt.Errorf("timeout string is too short: %q", s)
	}
	var d time.Duration
	switch s[size-1] {
	case 'H':
		d = time.Hour
	case 'M':
		d = time.Minute
	case 'S':
		d = time.Second
	case 'm':
		d = time.Millisecond
	case 'u':
		d = time.Microsecond
	case 'n':
		d = time.Nanosecond
	default:
		return 0, fmt.Errorf("timeout unit is not recognized: %q", s)
	}
	t, err := strconv.ParseUint(s[:size-1], 10, 64)
	if err != nil {
		return 0, err
	}
	if t > uint64(math.MaxInt64)/uint64(d) {
		return time.Duration(math.MaxInt64), nil
	}
	return d * time.Duration(t), nil
}
