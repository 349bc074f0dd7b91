package storetest

import (
	"context"
	"database/sql/driver"
	"errors"
	"regexp"
	"sync"
)

// Faults is the store's failure seam for tests: a database/sql/driver
// that wraps the real one (store.Options.WrapConnector takes Wrap),
// delegates everything to it, and on cue
//
//   - fails a transaction's COMMIT: it is rolled back and nothing is
//     written (FailCommits);
//   - loses a COMMIT: it is sent to the database, which commits it, and
//     then the driver reports a failure and drops the connection, so the
//     store can't tell whether it was written (LoseCommits);
//   - fails, or holds until released, statements whose SQL matches a
//     pattern (FailStatements, HangStatements);
//   - makes the database look down: every new transaction, statement and
//     connection fails until Up (Down).
//
// The store's code runs over it unchanged. A commit fault applies to the
// next transactions in which a statement matched its pattern (or to any
// transaction, for the pattern ""), so that a test can aim at one kind of
// write while the store's own heartbeat and other writes go on.
type Faults struct {
	mu    sync.Mutex
	rules []*rule
	down  bool
	fired chan Fired
}

// Fired says that a fault was applied.
type Fired struct {
	// Fault is "fail commit", "lose commit", "fail statement", "hang
	// statement" or "down".
	Fault string
	// Query is the statement (for a commit fault, the one that matched).
	Query string
}

// Errors the faults inject. A test asserts on what the store and the
// service make of them, never on their text.
var (
	ErrInjectedCommit    = errors.New("storetest: injected failure of COMMIT; nothing was written")
	ErrLostCommit        = errors.New("storetest: connection lost after COMMIT was sent")
	ErrInjectedStatement = errors.New("storetest: injected statement failure")
	ErrDown              = errors.New("storetest: the database is down")
)

type faultKind int

const (
	failCommit faultKind = iota + 1
	loseCommit
	failStatement
	hangStatement
)

func (k faultKind) String() string {
	switch k {
	case failCommit:
		return "fail commit"
	case loseCommit:
		return "lose commit"
	case failStatement:
		return "fail statement"
	case hangStatement:
		return "hang statement"
	}
	return "fault"
}

type rule struct {
	kind    faultKind
	pattern *regexp.Regexp // nil matches everything
	left    int            // applications left; negative: until removed
	release chan struct{}  // hangStatement: closed to let statements go
}

// NewFaults returns a seam with no faults set: everything goes through.
func NewFaults() *Faults {
	return &Faults{fired: make(chan Fired, 1024)}
}

// Fired receives a value each time a fault is applied (older ones are
// dropped if nobody reads), so that a test can wait for one.
func (f *Faults) Fired() <-chan Fired { return f.fired }

// FailCommits makes the COMMIT of the next n transactions that ran a
// statement matching pattern (a regular expression; "" for any) fail:
// they are rolled back, and the driver returns ErrInjectedCommit.
func (f *Faults) FailCommits(pattern string, n int) { f.add(failCommit, pattern, n) }

// LoseCommits makes the COMMIT of the next n transactions that ran a
// statement matching pattern be sent and then reported failed
// (ErrLostCommit), with the connection dropped: the data is written, and
// the store can't know it.
func (f *Faults) LoseCommits(pattern string, n int) { f.add(loseCommit, pattern, n) }

// FailStatements makes the next n statements matching pattern fail with
// ErrInjectedStatement (n < 0: until Clear), without running them.
func (f *Faults) FailStatements(pattern string, n int) { f.add(failStatement, pattern, n) }

// HangStatements holds every statement matching pattern, before it runs,
// until release is called or the statement's context ends.
func (f *Faults) HangStatements(pattern string) (release func()) {
	r := f.add(hangStatement, pattern, -1)
	var once sync.Once
	return func() {
		once.Do(func() {
			f.remove(r)
			close(r.release)
		})
	}
}

// Down makes the database look down: every new connection, transaction,
// statement and ping fails with ErrDown, and so does every COMMIT, until
// Up. Transactions already begun fail at their next statement.
func (f *Faults) Down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
}

// Up ends Down.
func (f *Faults) Up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = false
}

// Clear removes every fault (releasing hung statements) and ends Down.
func (f *Faults) Clear() {
	f.mu.Lock()
	rules := f.rules
	f.rules, f.down = nil, false
	f.mu.Unlock()
	for _, r := range rules {
		if r.release != nil {
			close(r.release)
		}
	}
}

func (f *Faults) add(kind faultKind, pattern string, n int) *rule {
	r := &rule{kind: kind, left: n}
	if pattern != "" {
		r.pattern = regexp.MustCompile(pattern)
	}
	if kind == hangStatement {
		r.release = make(chan struct{})
	}
	if n == 0 {
		return r
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
	return r
}

func (f *Faults) remove(r *rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.rules {
		if x == r {
			f.rules = append(f.rules[:i:i], f.rules[i+1:]...)
			return
		}
	}
}

func (f *Faults) isDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

func (f *Faults) note(kind, query string) {
	select {
	case f.fired <- Fired{Fault: kind, Query: query}:
	default:
	}
}

// take returns the first rule of one of kinds whose pattern matches any of
// queries, using up one of its applications, or nil.
func (f *Faults) take(queries []string, kinds ...faultKind) (*rule, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if !kindIn(r.kind, kinds) {
			continue
		}
		for _, q := range queries {
			if r.pattern != nil && !r.pattern.MatchString(q) {
				continue
			}
			if r.left > 0 {
				r.left--
				if r.left == 0 {
					f.rules = append(f.rules[:i:i], f.rules[i+1:]...)
				}
			}
			return r, q
		}
		if r.pattern == nil && len(queries) == 0 {
			if r.left > 0 {
				r.left--
				if r.left == 0 {
					f.rules = append(f.rules[:i:i], f.rules[i+1:]...)
				}
			}
			return r, ""
		}
	}
	return nil, ""
}

func kindIn(k faultKind, ks []faultKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// statement applies the statement faults to query before it runs.
func (f *Faults) statement(ctx context.Context, query string) error {
	if f.isDown() {
		f.note("down", query)
		return ErrDown
	}
	r, _ := f.take([]string{query}, failStatement, hangStatement)
	if r == nil {
		return nil
	}
	f.note(r.kind.String(), query)
	if r.kind == failStatement {
		return ErrInjectedStatement
	}
	select {
	case <-r.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wrap returns a connector whose connections are c's, with the faults.
func (f *Faults) Wrap(c driver.Connector) driver.Connector {
	return &faultConnector{f: f, c: c}
}

type faultConnector struct {
	f *Faults
	c driver.Connector
}

func (c *faultConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if c.f.isDown() {
		c.f.note("down", "connect")
		return nil, ErrDown
	}
	conn, err := c.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &faultConn{f: c.f, c: conn}, nil
}

func (c *faultConnector) Driver() driver.Driver { return c.c.Driver() }

// faultConn wraps a driver.Conn. It implements every optional interface
// database/sql looks for, delegating to the wrapped connection's when it
// has one and doing what database/sql would do without it otherwise.
type faultConn struct {
	f      *Faults
	c      driver.Conn
	mu     sync.Mutex
	broken bool     // a lost commit dropped it
	ran    []string // statements of the open transaction
}

var (
	_ driver.Conn               = (*faultConn)(nil)
	_ driver.ConnBeginTx        = (*faultConn)(nil)
	_ driver.ConnPrepareContext = (*faultConn)(nil)
	_ driver.ExecerContext      = (*faultConn)(nil)
	_ driver.QueryerContext     = (*faultConn)(nil)
	_ driver.Pinger             = (*faultConn)(nil)
	_ driver.NamedValueChecker  = (*faultConn)(nil)
	_ driver.SessionResetter    = (*faultConn)(nil)
	_ driver.Validator          = (*faultConn)(nil)
)

func (c *faultConn) isBroken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

func (c *faultConn) ranStatement(query string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ran = append(c.ran, query)
}

// before checks the connection and applies the statement faults.
func (c *faultConn) before(ctx context.Context, query string) error {
	if c.isBroken() {
		return driver.ErrBadConn
	}
	if err := c.f.statement(ctx, query); err != nil {
		return err
	}
	c.ranStatement(query)
	return nil
}

func (c *faultConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *faultConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.isBroken() {
		return nil, driver.ErrBadConn
	}
	if c.f.isDown() {
		return nil, ErrDown
	}
	var st driver.Stmt
	var err error
	if p, ok := c.c.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.c.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	fs := &faultStmt{conn: c, s: st, query: query}
	if _, ok := st.(driver.NamedValueChecker); ok {
		// database/sql asks a statement's checker first, and the
		// connection's only if the statement has none: keep it so.
		return &checkingStmt{fs}, nil
	}
	return fs, nil
}

func (c *faultConn) Close() error { return c.c.Close() }

// Unwrap returns the real driver's connection, for code that needs it (the
// store's pooler detection reads pgx's own).
func (c *faultConn) Unwrap() driver.Conn { return c.c }

func (c *faultConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *faultConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.isBroken() {
		return nil, driver.ErrBadConn
	}
	if c.f.isDown() {
		c.f.note("down", "begin")
		return nil, ErrDown
	}
	var tx driver.Tx
	var err error
	if b, ok := c.c.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = c.c.Begin()
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ran = nil
	c.mu.Unlock()
	return &faultTx{conn: c, tx: tx}, nil
}

func (c *faultConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.c.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if err := c.before(ctx, query); err != nil {
		return nil, err
	}
	return e.ExecContext(ctx, query, args)
}

func (c *faultConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.c.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if err := c.before(ctx, query); err != nil {
		return nil, err
	}
	return q.QueryContext(ctx, query, args)
}

func (c *faultConn) Ping(ctx context.Context) error {
	if c.isBroken() {
		return driver.ErrBadConn
	}
	if c.f.isDown() {
		return ErrDown
	}
	if p, ok := c.c.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *faultConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.c.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *faultConn) ResetSession(ctx context.Context) error {
	if c.isBroken() {
		return driver.ErrBadConn
	}
	if r, ok := c.c.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *faultConn) IsValid() bool {
	if c.isBroken() {
		return false
	}
	if v, ok := c.c.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

type faultTx struct {
	conn *faultConn
	tx   driver.Tx
}

func (t *faultTx) Commit() error {
	c := t.conn
	c.mu.Lock()
	ran := c.ran
	c.ran = nil
	c.mu.Unlock()
	if c.f.isDown() {
		t.tx.Rollback()
		c.f.note("down", "commit")
		return ErrDown
	}
	r, q := c.f.take(ran, failCommit, loseCommit)
	if r == nil {
		return t.tx.Commit()
	}
	c.f.note(r.kind.String(), q)
	if r.kind == failCommit {
		t.tx.Rollback()
		return ErrInjectedCommit
	}
	if err := t.tx.Commit(); err != nil {
		return err
	}
	c.mu.Lock()
	c.broken = true
	c.mu.Unlock()
	return ErrLostCommit
}

func (t *faultTx) Rollback() error {
	t.conn.mu.Lock()
	t.conn.ran = nil
	t.conn.mu.Unlock()
	return t.tx.Rollback()
}

type faultStmt struct {
	conn  *faultConn
	s     driver.Stmt
	query string
}

var (
	_ driver.StmtExecContext  = (*faultStmt)(nil)
	_ driver.StmtQueryContext = (*faultStmt)(nil)
)

func (s *faultStmt) Close() error  { return s.s.Close() }
func (s *faultStmt) NumInput() int { return s.s.NumInput() }

func (s *faultStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *faultStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *faultStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.conn.before(ctx, s.query); err != nil {
		return nil, err
	}
	if e, ok := s.s.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return s.s.Exec(values(args))
}

func (s *faultStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.conn.before(ctx, s.query); err != nil {
		return nil, err
	}
	if q, ok := s.s.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	return s.s.Query(values(args))
}

// checkingStmt is a faultStmt whose statement checks its own arguments.
type checkingStmt struct{ *faultStmt }

func (s *checkingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	return s.s.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, v := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return out
}

func values(args []driver.NamedValue) []driver.Value {
	out := make([]driver.Value, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}
