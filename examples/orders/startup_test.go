package main

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages" 2: orders started while its PostgreSQL was being promoted (a Patroni
// member in recovery, SQLSTATE 57P03 cannot_connect_now) exited 1 at once. Against a real
// standby with hot_standby off, orders now waits (a warning naming the condition), and once
// the standby is promoted it migrates, applies every order and exits 0 at idle.
func TestOrdersStartedWhileTheDatabaseIsInRecoveryWaitsForIt(t *testing.T) {
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	primary := testenv.StartOwnPostgres(t, "")
	standby := primary.StartStandbyWith(t, "hot_standby = off")
	ctx := context.Background()
	if _, err := pgx.Connect(ctx, standby.URL); err == nil || !strings.Contains(err.Error(), "57P03") {
		t.Fatalf("connecting to the standby: %v; want 57P03 (the test needs a server that says not yet)", err)
	}
	topic := testenv.Topic(t, brokers, 1)
	args := []string{"--brokers", brokers, "--database-url", standby.URL, "--topic", topic, "--group", testenv.Group(t)}
	if r := runOrders(t, bin, 60*time.Second, append(args, "--generate", "40", "--produce-only")...); r.code != 0 {
		t.Fatalf("produce: exit %d\n%s", r.code, r.stderr)
	}
	cctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	addr := testenv.FreeAddr(t)
	cmd := exec.CommandContext(cctx, bin, append(args, "--exit-when-idle", "2s", "--metrics-addr", addr)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("orders exited (%v) while its database was in recovery; want it to wait\n%s", err, errOut.String())
	case <-time.After(6 * time.Second):
	}
	// Probes answer while it waits: a liveness probe must not restart a process waiting out a
	// promotion (before, nothing listened until the consumer existed: connection refused).
	if code, body := probe(t, addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while waiting for the database: %d %s, want 200", code, body)
	}
	if code, body := probe(t, addr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"starting":true`) || !strings.Contains(body, "waiting for the database") {
		t.Fatalf("/readyz while waiting for the database: %d %s, want 503 naming the wait", code, body)
	}
	standby.Promote(t)
	var readyOnce atomic.Bool // the consumer's own readiness once it runs
	go func() {
		for cctx.Err() == nil && !readyOnce.Load() {
			if code, _ := testenv.Get(addr, "/readyz"); code == http.StatusOK {
				readyOnce.Store(true)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("orders did not exit at idle within 90 s of the promotion\n%s", errOut.String())
	}
	if err != nil {
		t.Fatalf("orders: %v after the promotion\n%s", err, errOut.String())
	}
	if !readyOnce.Load() {
		t.Fatalf("/readyz never answered 200 between the promotion and the idle exit\n%s", errOut.String())
	}
	if s := errOut.String(); !strings.Contains(s, "database not ready at start") || !strings.Contains(s, "57P03 cannot_connect_now") {
		t.Fatalf("no warning naming 57P03 cannot_connect_now while it waited:\n%s", s)
	}
	conn, err := pgx.Connect(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM order_totals`).Scan(&n); err != nil || n != 40 {
		t.Fatalf("%d orders applied (%v), want 40\n%s", n, err, out.String())
	}
}

// Issue "outages" 3: with no broker reachable, a bad --database-url (a wrong password, a
// database that does not exist) was reported only after the topics' 30 s timeout. The
// database is checked first: exit 1 within seconds, the last line naming the refusal.
func TestBadDatabaseURLIsNamedWithinSecondsWithNoBroker(t *testing.T) {
	bin := buildOrders(t)
	dsn := testenv.DatabaseURL(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Password == "" {
		t.Fatal("DATABASE_URL has no password; the test needs a server that checks one")
	}
	wrongPassword := strings.Replace(dsn, ":"+cfg.Password+"@", ":not-"+cfg.Password+"@", 1)
	i := strings.LastIndex(dsn, "/"+cfg.Database)
	if i < 0 {
		t.Fatal("DATABASE_URL names no database in its path")
	}
	noDatabase := dsn[:i] + "/no_such_database_here" + dsn[i+1+len(cfg.Database):]
	for _, c := range []struct{ name, url, want string }{
		{"wrong password", wrongPassword, "28P01"},
		{"no such database", noDatabase, "3D000"},
	} {
		r := runOrders(t, bin, 60*time.Second, "--brokers", "127.0.0.1:1", "--database-url", c.url, "--topic", "t", "--group", "g", "--exit-when-idle", "1s")
		last := strings.TrimSpace(r.stderr)
		if i := strings.LastIndex(last, "\n"); i >= 0 {
			last = last[i+1:]
		}
		if r.code != 1 || !strings.Contains(last, c.want) || r.took > 10*time.Second {
			t.Errorf("%s with no broker: exit %d after %s, last line %q; want exit 1 within 10 s naming %s", c.name, r.code, r.took.Round(time.Millisecond), last, c.want)
		}
		if strings.Contains(r.stderr, c.url) || strings.Contains(r.stderr, cfg.Password+"@") {
			t.Errorf("%s: the output shows the URL or its password", c.name)
		}
	}
}

// probe is testenv.Get; a request that fails fails t.
func probe(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	code, body := testenv.Get(addr, path)
	if code == 0 {
		t.Fatalf("GET %s: %s", path, body)
	}
	return code, body
}
