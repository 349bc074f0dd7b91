package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Replication modes of a Patroni cluster, as .ci/pgcluster starts them.
const (
	ReplicationStrict    = "strict"    // synchronous_mode and synchronous_mode_strict
	ReplicationNonStrict = "nonstrict" // synchronous_mode alone
	ReplicationAsync     = "async"     // neither
)

// Fronts of a Patroni cluster: the ways a client reaches its leader.
const (
	FrontHAProxy   = "haproxy"   // through HAProxy (Patroni's REST GET /primary)
	FrontMultiHost = "multihost" // a URL naming both nodes, target_session_attrs=read-write
	FrontPooler    = "pooler"    // through PgBouncer (transaction mode) to HAProxy
)

// Patroni is a two-node PostgreSQL cluster managed by Patroni, with
// HAProxy and PgBouncer in front, that `.ci/pgcluster` started (see the
// script for the shape), driven through the script.
type Patroni struct {
	// Script is the path of .ci/pgcluster, and Dir the cluster's.
	Script, Dir string
	log         io.Writer
	// URL goes through HAProxy to the leader (Patroni's REST GET /primary);
	// MultiHostURL names both nodes, with target_session_attrs=read-write;
	// PoolerURL goes through PgBouncer (transaction mode) to HAProxy. Each
	// names the database "payments".
	URL, MultiHostURL, PoolerURL string
}

// PatroniTools lists what a Patroni cluster needs and this machine lacks:
// Patroni, etcd, HAProxy, PgBouncer, PostgreSQL, curl or jq.
func PatroniTools() (missing []string) {
	for _, bin := range []string{"patroni", "patronictl", "etcd", "haproxy", "pgbouncer", "curl", "jq"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := exec.LookPath("/usr/sbin/" + bin); err != nil {
				missing = append(missing, bin)
			}
		}
	}
	if _, err := ServerBin(); err != nil {
		missing = append(missing, "postgresql")
	}
	return missing
}

// StartPatroni starts a cluster in dir with the script (`bash SCRIPT
// start DIR [--nonstrict | --async]`) in the replication mode, and waits
// until a leader and a standby stream. The script's standard error goes to
// log, if not nil. If the start fails, it stops what it started.
func StartPatroni(ctx context.Context, script, dir, replication string, log io.Writer) (*Patroni, error) {
	p := &Patroni{Script: script, Dir: dir, log: log}
	args := []string{"start", dir}
	if replication != ReplicationStrict {
		args = append(args, "--"+replication)
	}
	out, err := p.Run(ctx, args...)
	if err != nil {
		p.Stop()
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if !ok {
			continue
		}
		value = strings.Trim(value, `'"`)
		switch name {
		case "PAYMENTS_PGCLUSTER_URL":
			p.URL = value
		case "PAYMENTS_PGCLUSTER_MULTIHOST_URL":
			p.MultiHostURL = value
		case "PAYMENTS_PGCLUSTER_POOLER_URL":
			p.PoolerURL = value
		}
	}
	return p, nil
}

// FrontURL is the database URL through front (FrontHAProxy,
// FrontMultiHost or FrontPooler).
func (p *Patroni) FrontURL(front string) (string, error) {
	u, name := "", ""
	switch front {
	case FrontHAProxy:
		u, name = p.URL, "PAYMENTS_PGCLUSTER_URL"
	case FrontMultiHost:
		u, name = p.MultiHostURL, "PAYMENTS_PGCLUSTER_MULTIHOST_URL"
	case FrontPooler:
		u, name = p.PoolerURL, "PAYMENTS_PGCLUSTER_POOLER_URL"
	}
	if u == "" {
		return "", fmt.Errorf("%s start printed no %s (front %q)", p.Script, name, front)
	}
	return u, nil
}

// Leader is the node Patroni says leads and runs, or "".
func (p *Patroni) Leader(ctx context.Context) (string, error) {
	out, err := p.Run(ctx, "status", p.Dir)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[1] == "leader" && f[2] == "running" {
			return f[0], nil
		}
	}
	return "", nil
}

// WALSender is the process ID of the running leader's WAL sender (the
// cluster has one standby): stopping it stalls replication.
func (p *Patroni) WALSender(ctx context.Context) (int, error) {
	out, err := p.Run(ctx, "status", p.Dir)
	if err != nil {
		return 0, err
	}
	addr := ""
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "leader" && f[2] == "running" {
			addr = f[3]
		}
	}
	if addr == "" {
		return 0, errors.New("no leader runs")
	}
	db, err := sql.Open("pgx", "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var pid int
	if err := db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&pid); err != nil {
		return 0, fmt.Errorf("find the leader's WAL sender: %w", err)
	}
	return pid, nil
}

// Stop stops the cluster (thawing a frozen server first), for 2 minutes at
// most.
func (p *Patroni) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := p.Run(ctx, "stop", p.Dir)
	return err
}

// Run runs the script with args and returns its standard output. Its
// standard error goes to the log, and into the error if it fails.
func (p *Patroni) Run(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", append([]string{p.Script}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if p.log != nil {
		cmd.Stderr = io.MultiWriter(&errb, p.log)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", p.Script, args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// RepoFile finds path, relative to the repository's root: the first
// directory above the working directory that holds go.mod.
func RepoFile(path string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, path), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
