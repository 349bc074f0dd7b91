package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/paymentsclient"
)

// errorDomain is the domain of paymentsd's ErrorInfo details.
const errorDomain = "paymentsd.example.com"

// callers drive payments through the replicas, each with keys of its own,
// and record every call.
type callers struct {
	replicas       []*replica
	hist           *history
	prefix         string        // starts every key, unique to the run
	keyBudget      time.Duration // how long a caller keeps trying one key
	attemptTimeout time.Duration // the deadline of each gRPC call
	// restLeave is the share of REST calls whose caller goes away before
	// the answer (see rest).
	restLeave float64
	restHTTP  *http.Client
	// stopping is closed when callers should start no new key.
	stopping chan struct{}
	keys     atomic.Int64 // keys started
	wg       sync.WaitGroup
}

// start starts raw gRPC callers, which retry a key as paymentsclient
// would, client callers, which call paymentsclient.Create, and REST
// callers. Each caller's calls alternate between the replicas. ctx ending
// cuts them off.
func (cs *callers) start(ctx context.Context, raw, client, rest int, seed uint64) {
	for i := range raw + client + rest {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		switch {
		case i < raw:
			cs.wg.Go(func() { cs.raw(ctx, i, rng) })
		case i < raw+client:
			cs.wg.Go(func() { cs.client(ctx, i, rng) })
		default:
			cs.wg.Go(func() { cs.rest(ctx, i, rng) })
		}
	}
}

// wait waits for the callers to finish their keys, after stopping is
// closed.
func (cs *callers) wait() { cs.wg.Wait() }

// next returns the caller's next payment, or nil once stopping.
func (cs *callers) next(id, n int, rng *rand.Rand) *paymentsv1.CreateMultiCardPaymentRequest {
	select {
	case <-cs.stopping:
		return nil
	default:
	}
	cs.keys.Add(1)
	return &paymentsv1.CreateMultiCardPaymentRequest{
		IdempotencyKey: fmt.Sprintf("%s-c%d-%d", cs.prefix, id, n),
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 100 + rng.Int64N(100000)},
	}
}

// raw is a caller that makes each gRPC call itself, retrying with the same
// key on the answers paymentsclient retries, until a verdict or its key
// budget is spent.
func (cs *callers) raw(ctx context.Context, id int, rng *rand.Rand) {
	for n := 0; ctx.Err() == nil; n++ {
		req := cs.next(id, n, rng)
		if req == nil {
			return
		}
		deadline := time.Now().Add(cs.keyBudget)
		for attempt := 0; ; attempt++ {
			ri := (id + attempt) % len(cs.replicas)
			actx, cancel := context.WithTimeout(ctx, cs.attemptTimeout)
			start := time.Now()
			resp, err := cs.replicas[ri].client.CreateMultiCardPayment(actx, req)
			end := time.Now()
			cancel()
			c := call{Caller: id, Kind: kindCreate, Key: req.GetIdempotencyKey(), Replica: ri, Start: start, End: end}
			retryAfter := fill(&c, resp, err)
			c.Final = c.Verdict != verdictRetry || !end.Before(deadline) || ctx.Err() != nil
			cs.hist.add(c)
			if c.Final {
				break
			}
			if !sleepCtx(ctx, min(retryDelay(rng, attempt, retryAfter), time.Until(deadline))) {
				break
			}
		}
	}
}

// rest is a caller that pays over REST, as a service without a gRPC
// client would. Its calls carry no deadline (no Grpc-Timeout header): each
// waits for paymentsd's answer, however long the record store takes, up to
// its key budget. But a share of them (-rest-leave) go away, closing the
// connection, after a random wait shorter than -attempt-timeout, as a
// client whose own timeout fires does; paymentsd's handler then sees its
// context cancelled. Either way the caller retries the key as told, as the
// raw callers do, and every call is recorded (one that went away is
// unanswered).
func (cs *callers) rest(ctx context.Context, id int, rng *rand.Rand) {
	for n := 0; ctx.Err() == nil; n++ {
		req := cs.next(id, n, rng)
		if req == nil {
			return
		}
		body := fmt.Sprintf(`{"idempotencyKey":%q,"amountMoney":{"currency":%q,"amount":%d}}`,
			req.GetIdempotencyKey(), req.GetAmountMoney().GetCurrency(), req.GetAmountMoney().GetAmount())
		deadline := time.Now().Add(cs.keyBudget)
		for attempt := 0; ; attempt++ {
			ri := (id + attempt) % len(cs.replicas)
			wait := time.Until(deadline)
			if rng.Float64() < cs.restLeave {
				wait = time.Duration(rng.Int64N(int64(cs.attemptTimeout))) + time.Millisecond
			}
			actx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
			start := time.Now()
			c := call{Caller: id, Kind: kindCreate, REST: true, Key: req.GetIdempotencyKey(), Replica: ri, Start: start}
			retryAfter := cs.postREST(actx, cs.replicas[ri].httpURL(), body, &c)
			c.End = time.Now()
			cancel()
			c.Final = c.Verdict != verdictRetry || !c.End.Before(deadline) || ctx.Err() != nil
			cs.hist.add(c)
			if c.Final {
				break
			}
			if !sleepCtx(ctx, min(retryDelay(rng, attempt, retryAfter), time.Until(deadline))) {
				break
			}
		}
	}
}

// postREST makes one CreateMultiCardPayment over REST and records its
// answer in c, as fill does a gRPC call's; it returns the RetryInfo delay.
func (cs *callers) postREST(ctx context.Context, url, body string, c *call) time.Duration {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/multi-card-payments", strings.NewReader(body))
	if err != nil {
		c.Code, c.Verdict = codes.Internal, verdictRetry
		return 0
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := cs.restHTTP.Do(hreq)
	if err != nil {
		// Gone before the answer (or never connected): unanswered.
		c.Code, c.Verdict = status.FromContextError(err).Code(), verdictRetry
		if ctx.Err() == nil {
			c.Code = codes.Unavailable
		}
		return 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.Code, c.Verdict = codes.Unavailable, verdictRetry
		return 0
	}
	if resp.StatusCode == http.StatusOK {
		var ok struct {
			Payment json.RawMessage `json:"payment"`
		}
		if json.Unmarshal(b, &ok) != nil || len(ok.Payment) == 0 {
			c.Code, c.Verdict = codes.Internal, verdictRetry
			return 0
		}
		c.Code, c.Reply, c.Verdict, c.Answered = codes.OK, []byte(ok.Payment), verdictOK, true
		return 0
	}
	var st struct {
		Code    codes.Code `json:"code"`
		Details []struct {
			Type       string `json:"@type"`
			Domain     string `json:"domain"`
			Reason     string `json:"reason"`
			RetryDelay string `json:"retryDelay"`
		} `json:"details"`
	}
	if json.Unmarshal(b, &st) != nil {
		// Not paymentsd's answer (a proxy's, say): unanswered.
		c.Code, c.Verdict = codes.Unavailable, verdictRetry
		return 0
	}
	var retryAfter time.Duration
	for _, d := range st.Details {
		switch {
		case strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") && d.Domain == errorDomain:
			c.Reason = d.Reason
		case strings.HasSuffix(d.Type, "google.rpc.RetryInfo"):
			retryAfter, _ = time.ParseDuration(d.RetryDelay)
		}
	}
	c.Code = st.Code
	c.Answered = c.Reason != ""
	c.Verdict = classify(c.Code, c.Reason)
	return retryAfter
}

// client is a caller that pays through paymentsclient.Create, whose
// attempts go to the replicas in turn and are recorded too.
func (cs *callers) client(ctx context.Context, id int, rng *rand.Rand) {
	pc := paymentsclient.New(&recordingConn{cs: cs, caller: id}, paymentsclient.WithAttemptTimeout(cs.attemptTimeout))
	for n := 0; ctx.Err() == nil; n++ {
		req := cs.next(id, n, rng)
		if req == nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, cs.keyBudget)
		start := time.Now()
		resp, err := pc.Create(cctx, req)
		end := time.Now()
		cancel()
		c := call{Caller: id, Kind: kindClient, Key: req.GetIdempotencyKey(), Replica: -1, Start: start, End: end, Final: true}
		var e *paymentsclient.Error
		switch {
		case err == nil:
			c.Code, c.Reply, c.Verdict = codes.OK, resp.GetPaymentJson(), verdictOK
		case errors.As(err, &e):
			c.Code, c.Reason = e.Code, e.Reason
			switch {
			case errors.Is(err, paymentsclient.ErrNotCreated):
				c.Verdict = verdictNotCreated
			case errors.Is(err, paymentsclient.ErrOutcomeUnknown), errors.Is(err, paymentsclient.ErrInProgress):
				c.Verdict = verdictUnknown
			default:
				c.Verdict = verdictRefused
			}
		default:
			c.Code, c.Verdict = status.Code(err), verdictRefused
		}
		cs.hist.add(c)
	}
}

// recordingConn is the connection a client caller's paymentsclient uses:
// each call goes to the next replica, and each CreateMultiCardPayment is
// recorded as an attempt.
type recordingConn struct {
	cs     *callers
	caller int
	n      atomic.Int64
}

func (rc *recordingConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ri := (rc.caller + int(rc.n.Add(1))) % len(rc.cs.replicas)
	start := time.Now()
	err := rc.cs.replicas[ri].conn.Invoke(ctx, method, args, reply, opts...)
	if req, ok := args.(*paymentsv1.CreateMultiCardPaymentRequest); ok {
		c := call{Caller: rc.caller, Kind: kindAttempt, Key: req.GetIdempotencyKey(), Replica: ri, Start: start, End: time.Now()}
		resp, _ := reply.(*paymentsv1.CreateMultiCardPaymentResponse)
		fill(&c, resp, err)
		rc.cs.hist.add(c)
	}
	return err
}

func (rc *recordingConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return rc.cs.replicas[0].conn.NewStream(ctx, desc, method, opts...)
}

// fill records an answer to CreateMultiCardPayment in c, and returns its
// RetryInfo delay, if any.
func fill(c *call, resp *paymentsv1.CreateMultiCardPaymentResponse, err error) time.Duration {
	if err == nil {
		c.Code, c.Reply, c.Verdict, c.Answered = codes.OK, resp.GetPaymentJson(), verdictOK, true
		return 0
	}
	st := status.Convert(err)
	var retryAfter time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == errorDomain {
				c.Reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	c.Code = st.Code()
	c.Answered = c.Reason != ""
	c.Verdict = classify(c.Code, c.Reason)
	return retryAfter
}

// classify is what an answer means to a caller, as paymentsclient reads it
// (its package comment's table): a verdict, or retry with the same key.
func classify(code codes.Code, reason string) string {
	switch reason {
	case paymentsclient.ReasonNotCreated:
		if code == codes.Unavailable || code == codes.ResourceExhausted {
			return verdictRetry // provider unreachable, circuit open, rate limited
		}
		return verdictNotCreated
	case paymentsclient.ReasonKeyReused, paymentsclient.ReasonKeyExpired, paymentsclient.ReasonKeyNotOwned, paymentsclient.ReasonCallerNotAllowed:
		return verdictRefused
	case paymentsclient.ReasonNotSent, "":
		if code == codes.InvalidArgument {
			return verdictRefused
		}
	}
	return verdictRetry
}

// retryDelay is the wait before the next attempt: paymentsd's RetryInfo
// with up to 10% added, else full jitter over 100 ms doubling to 2 s.
func retryDelay(rng *rand.Rand, attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return retryAfter + time.Duration(rng.Int64N(int64(retryAfter/10)+1))
	}
	ceiling := min(100*time.Millisecond<<min(attempt, 5), 2*time.Second)
	return time.Duration(rng.Int64N(int64(ceiling))) + 1
}
