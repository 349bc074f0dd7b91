package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// restJSON is the gateway's marshaler.
var restJSON = restMarshaler{&runtime.JSONPb{
	// Every scalar, enum and list, default or not (the OpenAPI document's
	// required fields); a message field that is unset is left out, never
	// null.
	MarshalOptions: protojson.MarshalOptions{EmitDefaultValues: true},
	// A misspelt field must not be silently dropped in a payments API:
	// unknown fields are an error that names the field.
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}}

// RESTJSON is m in JSON as the REST API writes it: every field, false,
// zero and empty ones included, and a payment's provider reply as its
// payment, exactly as received, rather than as payment_json. The
// operators' CLI writes -o json with it, so that a script reads the same
// JSON from either.
func RESTJSON(m proto.Message) ([]byte, error) {
	return restJSON.Marshal(m)
}

// strictDecoder is the gateway's JSON decoder, refusing anything but
// whitespace after the request's JSON value: `{…}{…}` is not one request.
type strictDecoder struct {
	runtime.DecoderWrapper
}

var errTrailingData = errors.New("the request body has data after its JSON value; send exactly one JSON object")

func (d strictDecoder) Decode(v any) error {
	if err := d.DecoderWrapper.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errTrailingData
	}
	return nil
}

// requireJSON refuses, with 415, a request body that is not declared as
// JSON. It runs inside the gateway, after routing, so a wrong method still
// gets 405 and an unknown path 404.
func requireJSON(env paymentsv1.Environment) runtime.Middleware {
	return func(next runtime.HandlerFunc) runtime.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
			if r.ContentLength != 0 && !isJSON(r.Header.Get("Content-Type")) {
				refuse(w, r, env, http.StatusUnsupportedMediaType, codes.InvalidArgument, "the request body must be JSON, sent with Content-Type: application/json", 0)
				return
			}
			next(w, r, params)
		}
	}
}

// isJSON reports whether a Content-Type is application/json, in any case,
// with no parameter but an optional UTF-8 charset.
func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

// routes maps each REST path template in the OpenAPI document (the
// gateway's routes, generated from the same HTTP rules) to its methods, for
// the Allow header of a 405.
type routes map[string][]string

func routesFromOpenAPI(doc []byte) (routes, error) {
	var d struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("read the OpenAPI document: %w", err)
	}
	rs := routes{}
	for path, ops := range d.Paths {
		for method := range ops {
			rs[path] = append(rs[path], strings.ToUpper(method))
		}
		slices.Sort(rs[path])
	}
	return rs, nil
}

// allowed returns the methods of the template that matches path.
//
// A trailing slash is a segment of its own, empty, as the gateway routes
// it: POST /v1/multi-card-payments/ is GET's path with an empty key, not
// POST's, and a 405 saying "use POST" to a POST would be no help.
func (rs routes) allowed(path string) []string {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for tmpl, methods := range rs {
		t := strings.Split(strings.Trim(tmpl, "/"), "/")
		if len(t) != len(segs) {
			continue
		}
		match := true
		for i := range t {
			if !strings.HasPrefix(t[i], "{") && t[i] != segs[i] {
				match = false
				break
			}
		}
		if match {
			return methods
		}
	}
	return nil
}

// routingError answers the gateway's routing failures in its own
// google.rpc.Status shape; a method the path does not serve gets 405 and an
// Allow header naming the methods it does (rather than the gateway's
// default, 501), and ErrorInfo REQUEST_NOT_SENT, as the REST port's other
// refusals: whatever the call meant to do, it sent nothing.
func (rs routes) routingError(env paymentsv1.Environment) runtime.RoutingErrorHandlerFunc {
	return func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
		if httpStatus != http.StatusMethodNotAllowed {
			runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
			return
		}
		allow := rs.allowed(r.URL.Path)
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
		}
		st := status.Newf(codes.Unimplemented, "%s is not allowed on this path; use %s; nothing was sent", r.Method, strings.Join(allow, " or "))
		runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, &runtime.HTTPStatusError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        withDetails(st, notSentInfo(env)),
		})
	}
}

// readDeadline gives every request on the HTTP port readTimeout, from when
// its header is in, for its body to arrive; net/http itself sets no bound
// on a body once ReadHeaderTimeout has covered the header. Without it a
// body trickled to any path would hold its connection, outside the
// in-flight cap and past Shutdown, for as long as its sender liked: even a
// handler that never reads the body does not end the request, since
// net/http drains up to 256 KiB of it before answering. Past the deadline
// that drain fails, and the connection is answered and closed. limitBody
// lifts the deadline once a REST body is in, so a long payment is not cut
// off by it (a read deadline passing while a handler runs cancels the
// request's context).
func readDeadline(readTimeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			// Not every ResponseWriter supports deadlines (httptest's
			// doesn't).
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(readTimeout))
		}
		next.ServeHTTP(w, r)
	})
}

// closeAfter ends an HTTP/1 connection with this answer, rather than
// drain a body paymentsd won't read. Over HTTP/2 only the stream ends (its
// unread body is reset): "Connection: close" there would close the whole
// connection, with every other caller's streams on it.
func closeAfter(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// limitBody reads the REST body up front, refusing one over max bytes with
// 413 and one that takes longer than readTimeout (readDeadline's, from
// when the request's header was in) with 408, before it reaches the
// gateway. The deadline is lifted once the body is in, so a long call is
// not cut off by it. (http.Server.ReadTimeout would not do instead: once
// it passes, the server cancels the request's context, even mid-payment.)
func limitBody(max int64, readTimeout time.Duration, env paymentsv1.Environment, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			// Not worth draining: the connection ends with the answer.
			closeAfter(w, r)
			refuse(w, r, env, http.StatusRequestEntityTooLarge, codes.InvalidArgument, fmt.Sprintf("request body is over the limit of %d bytes", max), 0)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
		if err != nil {
			var tooLarge *http.MaxBytesError
			switch {
			case errors.As(err, &tooLarge):
				closeAfter(w, r)
				refuse(w, r, env, http.StatusRequestEntityTooLarge, codes.InvalidArgument, fmt.Sprintf("request body is over the limit of %d bytes", max), 0)
			case errors.Is(err, os.ErrDeadlineExceeded):
				closeAfter(w, r)
				refuse(w, r, env, http.StatusRequestTimeout, codes.DeadlineExceeded, fmt.Sprintf("the request body did not arrive within %v", readTimeout), time.Second)
			default:
				refuse(w, r, env, http.StatusBadRequest, codes.InvalidArgument, "could not read the request body", 0)
			}
			return
		}
		if r.ContentLength != 0 {
			// Not every ResponseWriter supports deadlines (httptest's
			// doesn't).
			_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		}
		r.Body = &restBody{b: body}
		next.ServeHTTP(w, r)
	})
}

// dropEmptyQuery removes, from a REST request's query, every parameter
// with no value (afterSequence= or a bare afterSequence), so that a URL
// template left unfilled, `?afterSequence=&pageSize=`, means the defaults,
// as an absent parameter does, rather than a 400 for "" not being a
// number. Every other parameter is kept as written.
func dropEmptyQuery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			kept := make([]string, 0, strings.Count(r.URL.RawQuery, "&")+1)
			for _, p := range strings.Split(r.URL.RawQuery, "&") {
				if _, v, _ := strings.Cut(p, "="); v != "" {
					kept = append(kept, p)
				}
			}
			if q := strings.Join(kept, "&"); q != r.URL.RawQuery {
				r2 := r.Clone(r.Context())
				r2.URL.RawQuery = q
				r = r2
			}
		}
		next.ServeHTTP(w, r)
	})
}

// createPath is CreateMultiCardPayment's REST path, the port's one POST
// route (proto/payments/v1/payments_http.yaml).
const createPath = "/v1/multi-card-payments"

// createsPayment reports whether r is a CreateMultiCardPayment call.
func createsPayment(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Path == createPath
}

// refuse answers r, turned away before anything was sent by a server of
// env, with refusal's status.
func refuse(w http.ResponseWriter, r *http.Request, env paymentsv1.Environment, httpStatus int, code codes.Code, msg string, retryDelay time.Duration) {
	writeStatusJSON(w, httpStatus, refusal(env, code, msg, createsPayment(r), retryDelay))
}

// writeStatusJSON writes st as the gateway writes an error: its
// google.rpc.Status in JSON (marshalled as the gateway's marshaler does),
// details included.
func writeStatusJSON(w http.ResponseWriter, httpStatus int, st *status.Status) {
	setRetryAfter(w, st)
	opts := protojson.MarshalOptions{EmitUnpopulated: true}
	b, err := opts.Marshal(st.Proto())
	if err != nil {
		// Only a detail protojson can't resolve could fail; the code and
		// message still go out.
		b, _ = opts.Marshal(&spb.Status{Code: int32(st.Code()), Message: st.Message()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	w.Write(b)
}

// setRetryAfter gives a REST answer whose status carries a RetryInfo the
// same delay as a Retry-After header (RFC 9110: whole seconds, so rounded
// up), for HTTP clients and proxies that read only headers.
func setRetryAfter(w http.ResponseWriter, st *status.Status) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			secs := (ri.GetRetryDelay().AsDuration() + time.Second - 1) / time.Second
			w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
			return
		}
	}
}

// withRequestID gives every answer on the HTTP port an X-Request-Id: the
// caller's, if it is a valid request ID, or else paymentsd's own, made
// here. Either goes in the request's httpCall, which it puts in the
// request's context: paymentsd's own so that the gateway's call is logged
// and recorded under the same ID (as its request_id, never as the
// caller's); a caller's so that the call keeps it beside its own
// (caller_request_id), as over gRPC. Answers written before the gateway
// (a body too large, a key header and body that differ, too many calls in
// progress, no such route) carry it too.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &httpCall{}
		id := r.Header.Get("X-Request-Id")
		if len(r.Header.Values("X-Request-Id")) != 1 || !validRequestID(id) {
			id = newRequestID()
			r.Header.Del("X-Request-Id")
			c.ownRequestID = id
		} else {
			c.callerRequestID = id
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpCallKey{}, c)))
	})
}

// httpCall is what paymentsd knows of a request on the HTTP port, in its
// context from withRequestID on: one value for all of it, rather than a
// context (and a copy of the request) for each. For a REST call
// (trackGatewayCall sets gateway), callChain marks it when the gateway
// hands the call to the service: an error from before that is the
// gateway's own refusal of the request (its body could not be decoded),
// made before anything was sent.
type httpCall struct {
	// ownRequestID is the request ID withRequestID made for a request
	// that came without a valid one of its own; callerRequestID, the
	// caller's valid X-Request-Id. One of them is set.
	ownRequestID, callerRequestID string
	// caller is what the request's client certificate says of its caller
	// (identifyHTTP); nil without one.
	caller *caller
	// gateway: the request went to the REST gateway.
	gateway        bool
	reachedService bool
	// idempotencyKeys are a CreateMultiCardPayment call's Idempotency-Key
	// header values (applyHeaderKey).
	idempotencyKeys []string
	// afterWrite run once the answer is written (or could not be): what
	// the service holds for it until then.
	afterWrite []func()
}

type httpCallKey struct{}

// httpCallOf is the httpCall of the request whose context ctx is, or nil.
func httpCallOf(ctx context.Context) *httpCall {
	c, _ := ctx.Value(httpCallKey{}).(*httpCall)
	return c
}

// restCallOf is the httpCall of the REST call whose context ctx is, or nil.
func restCallOf(ctx context.Context) *httpCall {
	if c := httpCallOf(ctx); c != nil && c.gateway {
		return c
	}
	return nil
}

// trackGatewayCall marks a request as a REST call, and runs what the
// service holds for its answer (afterWrite) once the answer is written.
// It must run inside withRequestID.
func trackGatewayCall(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := httpCallOf(r.Context())
		if c == nil {
			// Not under withRequestID: a value of its own.
			c = &httpCall{}
			r = r.WithContext(context.WithValue(r.Context(), httpCallKey{}, c))
		}
		c.gateway = true
		if createsPayment(r) {
			c.idempotencyKeys = r.Header.Values(IdempotencyKeyHeader)
		}
		if r.URL.Path == listEventsPath {
			// A page is held until written: a caller that stops reading
			// must not hold it for ever. Reset afterwards, or the deadline
			// would cut off the next answer on a kept-alive connection.
			rc := http.NewResponseController(w)
			if rc.SetWriteDeadline(time.Now().Add(listWriteTimeout)) == nil {
				defer rc.SetWriteDeadline(time.Time{})
			}
		}
		defer func() {
			for _, f := range c.afterWrite {
				f()
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// listEventsPath is ListProviderEvents' REST path
// (proto/payments/v1/payments_http.yaml).
const listEventsPath = "/v1/provider-events"

// markReachedService notes, for restError, that the gateway handed the call
// in ctx to the service.
func markReachedService(ctx context.Context) {
	if c := restCallOf(ctx); c != nil {
		c.reachedService = true
	}
}

// overREST reports whether ctx is a REST call's. Its answer is written
// from payment_json alone (restMarshaler), so the handler need not build
// the payment's Struct.
func overREST(ctx context.Context) bool {
	return restCallOf(ctx) != nil
}

// gatewayRefusal reports whether err is the gateway's own refusal of r,
// made before the service saw the call.
func gatewayRefusal(r *http.Request) bool {
	c := restCallOf(r.Context())
	return c != nil && !c.reachedService
}

// openAPIWithVersion is the OpenAPI document with info.version set to
// version, so that the document served says which build serves it;
// nothing else in it changes.
func openAPIWithVersion(doc []byte, version string) ([]byte, error) {
	if version == "" {
		return doc, nil
	}
	var d map[string]json.RawMessage
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("read the OpenAPI document: %w", err)
	}
	var info map[string]json.RawMessage
	if err := json.Unmarshal(d["info"], &info); err != nil {
		return nil, fmt.Errorf("read the OpenAPI document's info: %w", err)
	}
	v, _ := json.Marshal(version)
	info["version"] = v
	b, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	d["info"] = b
	// Keys come out sorted, which a JSON reader doesn't mind; indented,
	// as generated, for a person reading it.
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return out, nil
}
