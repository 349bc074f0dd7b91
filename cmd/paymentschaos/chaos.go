package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"example.com/paymentsd/internal/pgtest"
	"example.com/paymentsd/internal/proc"
)

// chaos makes the run: it starts the store, the fake provider and the
// replicas, runs callers and faults, waits for settlement and checks. It
// returns the report, or an error if the run could not be made.
func chaos(ctx context.Context, o *options, cycle []string, dir string, args []string, logw io.Writer) (*report, error) {
	fmt.Fprintf(logw, "paymentschaos: seed %d, files in %s\n", o.seed, dir)
	rng := rand.New(rand.NewPCG(o.seed, 1))

	bin := o.paymentsd
	if bin == "" {
		fmt.Fprintln(logw, "building paymentsd…")
		var err error
		if bin, err = proc.BuildPaymentsd(ctx, dir, nil, logw); err != nil {
			return nil, err
		}
	}

	storeLog, err := os.Create(filepath.Join(dir, "store.log"))
	if err != nil {
		return nil, err
	}
	defer storeLog.Close()
	inj := &injector{
		down: [2]time.Duration{o.downMin, o.downMax}, lock: [2]time.Duration{o.lockMin, o.lockMax},
		freeze: [2]time.Duration{o.freezeMin, o.freezeMax}, unknownFor: o.unknownFor, settled: o.latencyMax + 2*time.Second,
		drain: o.shutdownTimeout(),
		rng:   rng, log: logw,
	}
	var dbURL string
	switch o.store {
	case storePostgres:
		fmt.Fprintln(logw, "starting PostgreSQL…")
		pg, err := startPostgres(ctx, dir, storeLog)
		if err != nil {
			return nil, err
		}
		defer pg.Close()
		inj.pg, dbURL = pg, pg.URL
	case storeSQLite:
		inj.sqlitePath = filepath.Join(dir, "records.db")
		dbURL = "sqlite:" + inj.sqlitePath
	case storePatroni:
		fmt.Fprintf(logw, "starting the Patroni cluster (bash %s start)…\n", o.pgcluster)
		pat, err := pgtest.StartPatroni(ctx, o.pgcluster, filepath.Join(dir, "pgcluster"), o.replication, storeLog)
		if err != nil {
			return nil, err
		}
		defer pat.Stop()
		inj.patroni = pat
		if dbURL, err = pat.FrontURL(o.front); err != nil {
			return nil, err
		}
	}

	certs, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	apiKey := "sk_chaos_" + randomHex(8)
	fake := newProvider(apiKey, o.provider, o.latencyMin, o.latencyMax, o.seed)
	defer fake.Close()
	inj.provider = fake
	// With replica-partition, each replica reaches PostgreSQL through a
	// proxy of its own, which the fault cuts.
	replicaURL := map[string]string{}
	if slices.Contains(cycle, faultReplicaPartition) {
		for i := range o.replicas {
			px, err := newCutProxy(fmt.Sprintf("127.0.0.1:%d", inj.pg.Port()))
			if err != nil {
				return nil, err
			}
			defer px.close()
			inj.proxies = append(inj.proxies, px)
			replicaURL[fmt.Sprintf("r%d", i)] = strings.Replace(dbURL, fmt.Sprintf("127.0.0.1:%d", inj.pg.Port()), px.addr(), 1)
		}
	}
	replicas := newReplicas(o.replicas, bin, dir, certs, func(name string) []string {
		url := dbURL
		if u, ok := replicaURL[name]; ok {
			url = u
		}
		return append([]string{
			"PAYMENTS_ENVIRONMENT=sandbox",
			"PAYMENTS_SANDBOX_BASE_URL=" + fake.AddListener(name),
			"PAYMENTS_SANDBOX_API_KEY=" + apiKey,
			"PAYMENTS_DATABASE_URL=" + url,
			"PAYMENTS_UPSTREAM_TIMEOUT=" + o.upstreamTO.String(),
			"PAYMENTS_PROVIDER_QUIET_PERIOD=" + o.quietPeriod.String(),
			"PAYMENTS_LOG_LEVEL=" + o.logLevel,
		}, o.paymentsdEnv...)
	})
	defer func() {
		for _, r := range replicas {
			r.close()
		}
	}()
	for _, r := range replicas {
		// One at a time: they migrate the store on start.
		if err := r.start(ctx); err != nil {
			return nil, err
		}
	}
	inj.replicas = replicas

	begin := time.Now()
	hist := &history{}
	cs := &callers{
		replicas: replicas, hist: hist, prefix: "chaos-" + randomHex(4),
		keyBudget: o.keyBudget, attemptTimeout: o.attemptTimeout, stopping: make(chan struct{}),
		restLeave: o.restLeave,
		restHTTP: &http.Client{Transport: &http.Transport{
			TLSClientConfig: certs.clientTLS(certs.caller), ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16,
		}},
	}
	callCtx, cutCallers := context.WithCancel(ctx)
	defer cutCallers()
	cs.start(callCtx, o.callers, o.clientCallers, o.restCallers, o.seed)
	var person *carelessPerson
	stopPerson, personDone := make(chan struct{}), make(chan struct{})
	if o.careless {
		person = &carelessPerson{replicas: replicas, interval: o.carelessEvery}
		go func() {
			defer close(personDone)
			person.run(ctx, stopPerson)
		}()
	} else {
		close(personDone)
	}
	rest := ""
	if o.restCallers > 0 {
		rest = fmt.Sprintf(", %d REST callers (%.0f%% of their calls go away)", o.restCallers, 100*o.restLeave)
	}
	fmt.Fprintf(logw, "running: %d replicas on %s, %d raw and %d paymentsclient callers%s, provider %s, careless person %v, faults %s about every %v\n",
		o.replicas, storeName(o), o.callers, o.clientCallers, rest, o.provider, o.careless, o.faults, o.faultInterval)

	var mu sync.Mutex
	var faults []fault
	stopFaults, faultsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(faultsDone)
		inj.schedule(ctx, cycle, o.faultInterval, stopFaults, func(f fault) {
			mu.Lock()
			defer mu.Unlock()
			faults = append(faults, f)
		})
	}()
	var problems []string
	tick := time.NewTicker(10 * time.Second)
	for {
		mu.Lock()
		nFaults := len(faults)
		mu.Unlock()
		elapsed, keys := time.Since(begin), int(cs.keys.Load())
		if elapsed >= o.duration && keys >= o.minKeys && nFaults >= o.minFaults {
			break
		}
		if elapsed >= o.maxDuration {
			problems = append(problems, fmt.Sprintf("-max-duration %v passed with %d keys and %d faults, short of -min-keys %d or -min-faults %d", o.maxDuration, keys, nFaults, o.minKeys, o.minFaults))
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
			fmt.Fprintf(logw, "%4.0fs: %d keys, %d faults\n", elapsed.Seconds(), keys, nFaults)
		}
	}
	tick.Stop()
	fmt.Fprintln(logw, "stopping faults, then callers…")
	close(stopFaults)
	<-faultsDone
	if !sleepCtx(ctx, o.tail) {
		return nil, ctx.Err()
	}
	close(cs.stopping)
	callersDone := make(chan struct{})
	go func() { cs.wait(); close(callersDone) }()
	select {
	case <-callersDone:
	case <-time.After(o.keyBudget + o.attemptTimeout + 10*time.Second):
		cutCallers()
		<-callersDone
	}
	end := time.Now()
	for _, r := range replicas {
		if err := r.exitedOnItsOwn(); err != nil {
			problems = append(problems, fmt.Sprintf("replica %s exited without a fault: %s", r.name, firstLine(err.Error())))
		}
	}
	for _, f := range faults {
		if f.Err != "" {
			problems = append(problems, fmt.Sprintf("fault %s %s was not undone: %s", f.Kind, f.Target, firstLine(f.Err)))
		}
	}

	calls := hist.all()
	var keys []string
	seen := make(map[string]bool)
	for _, c := range calls {
		if !seen[c.Key] {
			seen[c.Key] = true
			keys = append(keys, c.Key)
		}
	}
	var reader *replica
	for _, r := range replicas {
		if r.running() {
			reader = r
			break
		}
	}
	if reader == nil {
		return nil, fmt.Errorf("no replica is running to read the records from")
	}
	fmt.Fprintf(logw, "waiting up to %v for settlement of %d keys…\n", o.settleTimeout, len(keys))
	records, dueAtEnd := awaitSettlement(ctx, reader.admin, keys, o.settleTimeout, func(n int) {
		fmt.Fprintf(logw, "  %d due\n", n)
	})
	settleWait := time.Since(end)
	if o.careless {
		// The person resolved what was in doubt while settlement ran; read
		// every record once more, as they left it.
		close(stopPerson)
		<-personDone
		records, _ = awaitSettlement(ctx, reader.admin, keys, 0, func(int) {})
	}

	res := check(checkInput{
		Calls: calls, Provider: providerFacts(fake), Records: records, Faults: faults, Resolutions: person.resolutions(),
		Begin: begin, End: end, CommitGrace: o.commitGrace, Strict: o.strict,
		LosesCommits: o.store == storePatroni && o.replication != replicationStrict,
	})
	if o.historyOut != "" {
		if err := writeHistory(o.historyOut, begin, calls); err != nil {
			return nil, err
		}
	}
	return newReport(o, args, begin, end, dueAtEnd, settleWait, res, fake.AllKeyStats(), tallyLogs(replicas), problems), nil
}

func storeName(o *options) string {
	switch o.store {
	case storePatroni:
		mode := map[string]string{
			replicationStrict:    "strict synchronous",
			replicationNonStrict: "non-strict synchronous",
			replicationAsync:     "asynchronous",
		}[o.replication]
		return fmt.Sprintf("Patroni (%s replication) through %s", mode, o.front)
	case storeSQLite:
		return "one SQLite file"
	}
	return "PostgreSQL (a server of the run's own)"
}
