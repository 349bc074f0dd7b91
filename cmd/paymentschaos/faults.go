package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"example.com/paymentsd/internal/pgtest"
)

// Kinds of fault.
const (
	// faultPaymentsdKill (above): SIGKILL a replica, then start it again.
	faultPostgresKill  = "postgres-kill"        // SIGKILL the postmaster, then start it again
	faultPostgresStop  = "postgres-stop"        // pg_ctl stop -m immediate, then start
	faultSQLiteLock    = "sqlite-lock"          // hold the database's write lock from another process
	faultPrimaryKill   = "patroni-kill-primary" // SIGKILL the Patroni leader's node; the replica is promoted
	faultSwitchover    = "patroni-switchover"   // a planned switchover to the other node
	faultPoolerRestart = "pgbouncer-restart"    // restart PgBouncer: client connections drop
	// faultLoseCommits stalls the replication stream (SIGSTOP of the
	// leader's WAL sender) for -down-min to -down-max while callers pay,
	// then kills the leader's node: the standby is promoted without what
	// was committed meanwhile (with -replication=async; in synchronous
	// mode those commits wait, and are lost unacknowledged).
	faultLoseCommits = "patroni-lose-commits"
	// faultPostgresFreeze SIGSTOPs the postmaster and every process whose
	// parent it is, for -freeze-min to -freeze-max: a hung server, whose
	// connections stay open and whose commits neither land nor fail.
	faultPostgresFreeze = "postgres-freeze"
	// faultPostgresFreezeKill is faultPostgresFreeze with every replica
	// SIGKILLed at a random moment inside it, each restarted once the
	// server thaws: a replica that read a 2xx it could not commit dies
	// with it.
	faultPostgresFreezeKill = "postgres-freeze-kill"
	// faultFreezePrimary SIGSTOPs the Patroni leader's PostgreSQL (its
	// postmaster and children) for -freeze-min to -freeze-max while its
	// Patroni runs on; the standby is promoted meanwhile. Without
	// synchronous_mode_strict (-replication=nonstrict) the promoted node
	// commits alone, and the old leader, thawed, may take the leader key
	// back and rewind what it acknowledged.
	faultFreezePrimary = "patroni-freeze-primary"
	// faultFailoverAfterUnknown makes keys' attempts end OUTCOME_UNKNOWN
	// (the provider answers 503 to every request that arrives in the
	// first -unknown-for), lets those outcomes replicate, then stalls the
	// replication stream while callers retry them, and kills the leader
	// (as faultLoseCommits): with asynchronous replication the promoted
	// standby has their records back at the OUTCOME_UNKNOWN attempt,
	// which settlement is due to send again.
	faultFailoverAfterUnknown = "patroni-failover-after-unknown"
	// faultPostgresFreezeTerm is faultPostgresFreeze with every replica
	// sent SIGTERM at a random moment inside it: each drains with its
	// store hung, and is SIGKILLed if it has not exited termGrace later
	// (Kubernetes' terminationGracePeriodSeconds, as deploy/ sets it).
	// Each is started again once it has exited and the server is thawed.
	faultPostgresFreezeTerm = "postgres-freeze-term"
	// faultPostgresStopTerm stops the server (pg_ctl stop -m immediate)
	// and sends every replica SIGTERM while it is down, so each drains
	// with its store refusing connections; the server starts again once
	// they have exited (or been SIGKILLed termGrace later), then they do.
	faultPostgresStopTerm = "postgres-stop-term"
	// faultPostgresReadOnly turns the server read-only
	// (default_transaction_read_only, as a primary demoted in place or a
	// full disk would refuse writes) for -freeze-min to -freeze-max,
	// longer than a lease: every write fails at once while reads go on.
	faultPostgresReadOnly = "postgres-readonly"
	// faultReplicaPartition cuts one replica off from PostgreSQL (its
	// proxy to the server drops every byte both ways, closing nothing)
	// for -freeze-min to -freeze-max, while the other replicas reach it:
	// a network partition, the window docs/durability.md leaves ("a
	// replica cut off from the database alone").
	faultReplicaPartition = "replica-partition"
)

// termGrace is how long a replica sent SIGTERM may drain before it is
// SIGKILLed: deploy/'s terminationGracePeriodSeconds. drainLastChance is
// how long paymentsd's drain goes on writing outcomes after
// PAYMENTS_SHUTDOWN_TIMEOUT (internal/engine's outboxLastChance).
const (
	termGrace       = 30 * time.Second
	drainLastChance = time.Second
)

// faultsFor is which faults each store can be given.
var faultsFor = map[string][]string{
	storePostgres: {faultPaymentsdKill, faultPostgresKill, faultPostgresStop, faultPostgresFreeze, faultPostgresFreezeKill,
		faultPostgresFreezeTerm, faultPostgresStopTerm, faultPostgresReadOnly, faultReplicaPartition},
	storeSQLite: {faultPaymentsdKill, faultSQLiteLock},
	storePatroni: {faultPaymentsdKill, faultPrimaryKill, faultSwitchover, faultPoolerRestart, faultLoseCommits,
		faultFreezePrimary, faultFailoverAfterUnknown},
}

// defaultMix is the mix of faults when -faults is not given.
var defaultMix = map[string]string{
	storePostgres: "paymentsd-kill=1,postgres-stop=1,postgres-kill=1",
	storeSQLite:   "paymentsd-kill=1,sqlite-lock=1",
	storePatroni:  "patroni-kill-primary=2,patroni-switchover=1,paymentsd-kill=1",
}

// parseMix parses "kind=weight,…" (a bare kind weighs 1) into a cycle: each
// kind as many times as its weight. Faults are drawn from the cycle,
// shuffled, a cycle at a time, so a run of N whole cycles has each kind
// exactly in proportion.
func parseMix(s, storeKind string) ([]string, error) {
	var cycle []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		kind, w, hasWeight := strings.Cut(item, "=")
		weight := 1
		if hasWeight {
			var err error
			if weight, err = strconv.Atoi(w); err != nil || weight < 0 {
				return nil, fmt.Errorf("-faults: %q: the weight must be a whole number", item)
			}
		}
		if !slices.Contains(faultsFor[storeKind], kind) {
			return nil, fmt.Errorf("-faults: %q is not a fault of -store=%s (its faults: %s)", kind, storeKind, strings.Join(faultsFor[storeKind], ", "))
		}
		for range weight {
			cycle = append(cycle, kind)
		}
	}
	return cycle, nil
}

// injector injects faults, one at a time, each undone before it returns.
type injector struct {
	replicas   []*replica
	pg         *pgtest.Server
	patroni    *pgtest.Patroni
	provider   *provider
	sqlitePath string
	down       [2]time.Duration // how long a killed or stopped part stays down
	lock       [2]time.Duration // how long the SQLite lock is held
	freeze     [2]time.Duration // how long a frozen server stays frozen
	unknownFor time.Duration    // how long the provider answers 503 (faultFailoverAfterUnknown)
	drain      time.Duration    // the replicas' PAYMENTS_SHUTDOWN_TIMEOUT
	// proxies are the replicas' routes to PostgreSQL, by replica, when the
	// mix has replica-partition.
	proxies []*cutProxy
	// settled is how long after the provider's last 503 its outcomes have
	// surely been written and replicated: its longest latency, and a
	// margin.
	settled time.Duration
	rng     *rand.Rand
	log     io.Writer
}

// between is a random duration in [r[0], r[1]].
func (in *injector) between(r [2]time.Duration) time.Duration {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + time.Duration(in.rng.Int64N(int64(r[1]-r[0])))
}

// inject injects a fault of kind and undoes it.
func (in *injector) inject(ctx context.Context, kind string) fault {
	f := fault{Kind: kind}
	var err error
	switch kind {
	case faultPaymentsdKill:
		r := in.replicas[in.rng.IntN(len(in.replicas))]
		f.Target = r.name
		f.Start = time.Now()
		r.kill()
		sleepCtx(ctx, in.between(in.down))
		err = in.restart(ctx, r)
	case faultPostgresKill, faultPostgresStop:
		f.Start = time.Now()
		if kind == faultPostgresKill {
			err = in.pg.KillPostmaster()
		} else {
			err = in.pg.Stop(ctx, "immediate")
		}
		if err == nil {
			sleepCtx(ctx, in.between(in.down))
			err = startAgain(context.WithoutCancel(ctx), in.pg)
		}
	case faultSQLiteLock:
		release := make(chan struct{})
		var done <-chan error
		if done, err = holdSQLiteLock(ctx, in.sqlitePath, release); err == nil {
			f.Start = time.Now()
			sleepCtx(ctx, in.between(in.lock))
			close(release)
			err = <-done
		}
	case faultPrimaryKill:
		f.Start = time.Now()
		err = in.killPrimary(ctx, &f)
	case faultLoseCommits:
		var pid int
		if pid, err = in.patroni.WALSender(ctx); err == nil {
			f.Start = time.Now()
			if err = syscall.Kill(pid, syscall.SIGSTOP); err == nil {
				sleepCtx(ctx, in.between(in.down))
				err = in.killPrimary(ctx, &f)
				syscall.Kill(pid, syscall.SIGCONT) // dead with its node, unless the kill failed
			}
		}
	case faultPostgresFreeze, faultPostgresFreezeKill:
		err = in.freezePostgres(ctx, &f, kind == faultPostgresFreezeKill)
	case faultPostgresFreezeTerm:
		err = in.freezeTerm(ctx, &f)
	case faultPostgresStopTerm:
		f.Start = time.Now()
		if err = in.pg.Stop(ctx, "immediate"); err == nil {
			in.terminateAll(ctx, &f, 0)
			err = startAgain(context.WithoutCancel(ctx), in.pg)
			f.Undone = time.Now()
			if err == nil {
				err = in.restartTerminated(ctx, &f)
			}
		}
	case faultReplicaPartition:
		i := in.rng.IntN(len(in.replicas))
		f.Target, f.Start = in.replicas[i].name, time.Now()
		in.proxies[i].cut()
		sleepCtx(ctx, in.between(in.freeze))
		in.proxies[i].heal()
		f.Undone = time.Now()
	case faultPostgresReadOnly:
		if err = in.pg.ReadOnly(ctx, true); err == nil {
			f.Start = time.Now()
			sleepCtx(ctx, in.between(in.freeze))
			err = in.pg.ReadOnly(context.WithoutCancel(ctx), false)
			f.Undone = time.Now()
		}
	case faultFreezePrimary:
		var out string
		if out, err = in.patroni.Run(ctx, "freeze-primary", in.patroni.Dir); err == nil {
			f.Start, f.Target = time.Now(), strings.TrimSpace(out)
			sleepCtx(ctx, in.between(in.freeze))
			_, err = in.patroni.Run(context.WithoutCancel(ctx), "thaw", in.patroni.Dir)
			f.Undone = time.Now()
		}
		if err == nil {
			_, err = in.patroni.Run(ctx, "wait-healthy", in.patroni.Dir)
		}
	case faultFailoverAfterUnknown:
		f.Start = time.Now()
		in.provider.unknown.Store(true)
		sleepCtx(ctx, in.unknownFor)
		in.provider.unknown.Store(false)
		// The 503s' outcomes are written, and replicated, by now; the
		// callers' retries of those keys come from here on.
		sleepCtx(ctx, in.settled)
		var pid int
		if pid, err = in.patroni.WALSender(ctx); err == nil {
			if err = syscall.Kill(pid, syscall.SIGSTOP); err == nil {
				sleepCtx(ctx, in.between(in.down))
				err = in.killPrimary(ctx, &f)
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	case faultSwitchover:
		f.Start = time.Now()
		if _, err = in.patroni.Run(ctx, "switchover", in.patroni.Dir); err == nil {
			f.Undone = time.Now()
			_, err = in.patroni.Run(ctx, "wait-healthy", in.patroni.Dir)
		}
	case faultPoolerRestart:
		f.Start = time.Now()
		_, err = in.patroni.Run(ctx, "restart-pooler", in.patroni.Dir)
	default:
		err = fmt.Errorf("unknown fault %q", kind)
	}
	if f.Start.IsZero() {
		f.Start = time.Now()
	}
	if err != nil {
		f.Err = err.Error()
		f.Undone = time.Time{}
	} else if f.Undone.IsZero() {
		f.Undone = time.Now()
	}
	killed := ""
	for _, k := range f.Kills {
		if k.Termed.IsZero() {
			killed += fmt.Sprintf(" (killed %s at %.1fs)", k.Target, k.At.Sub(f.Start).Seconds())
			continue
		}
		how := "exited"
		if k.Killed {
			how = "SIGKILLed, still draining,"
		}
		killed += fmt.Sprintf(" (SIGTERM to %s at %.1fs, %s at %.1fs)", k.Target, k.Termed.Sub(f.Start).Seconds(), how, k.At.Sub(f.Start).Seconds())
	}
	fmt.Fprintf(in.log, "fault %s %s: %.1fs%s%s\n", kind, f.Target, time.Since(f.Start).Seconds(), killed, errSuffix(f.Err))
	return f
}

// killPrimary SIGKILLs the leader's node, waits until the other node
// leads (f is then undone), and restarts the dead node until the cluster
// is healthy again.
func (in *injector) killPrimary(ctx context.Context, f *fault) error {
	out, err := in.patroni.Run(ctx, "kill-primary", in.patroni.Dir)
	if err != nil {
		return err
	}
	f.Target = strings.TrimSpace(out)
	err = in.awaitLeader(ctx, f.Target)
	f.Undone = time.Now()
	if err == nil {
		_, err = in.patroni.Run(ctx, "restart-node", in.patroni.Dir, f.Target)
	}
	if err == nil {
		_, err = in.patroni.Run(ctx, "wait-healthy", in.patroni.Dir)
	}
	return err
}

// freezePostgres freezes the run's PostgreSQL server for -freeze-min to
// -freeze-max and thaws it; with kills, it SIGKILLs every replica at a
// random moment inside the freeze, noting each in f, and restarts them
// once the server is thawed.
func (in *injector) freezePostgres(ctx context.Context, f *fault, kills bool) error {
	d := in.between(in.freeze)
	var at []time.Duration
	if kills {
		for range in.replicas {
			at = append(at, d/10+time.Duration(in.rng.Int64N(int64(d*8/10)+1)))
		}
	}
	order := in.rng.Perm(len(at))
	slices.Sort(at)
	thaw, err := in.pg.Freeze()
	if err != nil {
		return err
	}
	f.Start = time.Now()
	for i, a := range at {
		sleepCtx(ctx, time.Until(f.Start.Add(a)))
		r := in.replicas[order[i]]
		r.kill()
		f.Kills = append(f.Kills, kill{Target: r.name, At: time.Now()})
	}
	sleepCtx(ctx, time.Until(f.Start.Add(d)))
	thaw()
	f.Undone = time.Now()
	return in.restartTerminated(ctx, f)
}

// freezeTerm freezes the run's PostgreSQL server for -freeze-min to
// -freeze-max and sends every replica SIGTERM at a random moment inside
// the freeze; it thaws the server at the freeze's end, waits for the
// replicas to have exited (or SIGKILLs them termGrace after their
// SIGTERM), and starts them again.
func (in *injector) freezeTerm(ctx context.Context, f *fault) error {
	d := in.between(in.freeze)
	thaw, err := in.pg.Freeze()
	if err != nil {
		return err
	}
	f.Start = time.Now()
	in.terminateAll(ctx, f, d*8/10)
	sleepCtx(ctx, time.Until(f.Start.Add(d)))
	thaw()
	f.Undone = time.Now()
	return in.restartTerminated(ctx, f)
}

// terminateAll sends every replica SIGTERM, each at a random moment in
// the next spread (at once when 0), and waits until each has exited, or
// SIGKILLs it termGrace after its SIGTERM. Each is noted in f as a kill at
// the moment it stopped writing (its exit, or its drain's end if it
// lingered): a replica that drained with an outcome it could not write
// died holding it.
func (in *injector) terminateAll(ctx context.Context, f *fault, spread time.Duration) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	for _, r := range in.replicas {
		var at time.Duration
		if spread > 0 {
			at = time.Duration(in.rng.Int64N(int64(spread) + 1))
		}
		wg.Go(func() {
			sleepCtx(ctx, time.Until(start.Add(at)))
			termed := time.Now()
			killed := r.terminate(termGrace)
			// Its outbox stopped writing when its drain ended, if it
			// lingered after that (closing a store that hangs).
			stopped := minTime(time.Now(), termed.Add(in.drain+drainLastChance))
			mu.Lock()
			f.Kills = append(f.Kills, kill{Target: r.name, At: stopped, Termed: termed, Killed: killed})
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(f.Kills, func(a, b kill) int { return a.At.Compare(b.At) })
}

// restartTerminated starts again the replicas f killed or stopped.
func (in *injector) restartTerminated(ctx context.Context, f *fault) error {
	for _, k := range f.Kills {
		for _, r := range in.replicas {
			if r.name == k.Target {
				if err := in.restart(ctx, r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// restart starts a killed replica again, trying for a minute: it may not
// reach its store at once.
func (in *injector) restart(ctx context.Context, r *replica) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := r.start(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(in.log, "restart %s: %v; trying again\n", r.name, firstLine(err.Error()))
		sleepCtx(ctx, time.Second)
	}
}

// awaitLeader waits until a node other than old leads.
func (in *injector) awaitLeader(ctx context.Context, old string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		leader, err := in.patroni.Leader(ctx)
		if err == nil && leader != "" && leader != old {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("no other node became the leader within 2m")
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// schedule injects faults from cycle, waiting about interval (half to one
// and a half times it) before each, until stop is closed; it reports each
// on record.
func (in *injector) schedule(ctx context.Context, cycle []string, interval time.Duration, stop <-chan struct{}, record func(fault)) {
	var queue []string
	for {
		wait := interval/2 + time.Duration(in.rng.Int64N(int64(interval)+1))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
		if len(queue) == 0 {
			queue = slices.Clone(cycle)
			in.rng.Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
		}
		kind := queue[0]
		queue = queue[1:]
		record(in.inject(ctx, kind))
	}
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " FAILED: " + firstLine(e)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
