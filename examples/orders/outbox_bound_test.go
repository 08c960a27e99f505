package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "outages" 1, as the acceptance tried it: orders drains with the in-process table
// relay and --max-outbox-rows 20000 while statement_timeout = 1ms is set on the database for
// 20 s (ALTER DATABASE; the sessions are ended so that every one, not only new ones, runs
// under it, as after a restart of the pools), --batch-size 500. Once the outbox's open rows
// peaked at 24,000 (the bound read from a lagging estimate). Now: /readyz answers 503 naming the relay while
// it cannot read, the outbox never holds more than the bound plus one batch per partition,
// and once the setting is gone every event is published and orders exits 0 at idle.
func TestOutboxBoundHoldsWhileTheDatabaseTimesStatementsOut(t *testing.T) {
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	dsn := testenv.Database(t)
	ctx := context.Background()
	const orders, bound, partitions, batch = 100000, 20000, 3, 500
	topic := testenv.Topic(t, brokers, partitions)
	events := testenv.Topic(t, brokers, partitions)
	args := []string{"--brokers", brokers, "--database-url", dsn, "--topic", topic, "--group", testenv.Group(t), "--events-topic", events}
	if r := runOrders(t, bin, 120*time.Second, append(args, "--generate", fmt.Sprint(orders), "--produce-only")...); r.code != 0 {
		t.Fatalf("produce: exit %d\n%s", r.code, r.stderr)
	}
	// One session of the test's own, never ended, without the timeout.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["statement_timeout"] = "0"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) }) // after the cleanup below, which resets the setting on it
	var mu sync.Mutex                     // conn is the sampler's and the ALTERs'
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	setTimeout := func(set string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		q := `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` RESET statement_timeout`
		if set != "" {
			q = `ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET statement_timeout = '` + set + `'`
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { setTimeout("") })

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, append(args, "--max-outbox-rows", fmt.Sprint(bound), "--batch-size", fmt.Sprint(batch), "--metrics-addr", addr, "--exit-when-idle", "10s")...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var peak, applied int64
	sample := func() {
		mu.Lock()
		defer mu.Unlock()
		var n int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pack_count), 0) FROM kafkatx.outbox WHERE state IN ('pending', 'parked', 'packed')`).Scan(&n); err == nil && n > peak {
			peak = n
		}
		_ = conn.QueryRow(ctx, `SELECT coalesce(sum(orders), 0) FROM customer_totals`).Scan(&applied)
	}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
				sample()
			}
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		a := applied
		mu.Unlock()
		if a >= 10000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orders applied %d orders in 2 minutes\n%s", a, errOut.String())
		}
	}
	setTimeout("1ms")
	notReady := ""
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "relay") {
				notReady = string(b)
			}
		}
	}
	setTimeout("")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("orders: %v\n%s", err, errOut.String())
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("orders did not exit at idle\n%s", errOut.String())
	}
	close(stopSampling)
	<-sampled
	sample()
	limit := int64(bound + partitions*batch)
	t.Logf("outbox peak %d open records (a pack counts its records) (bound %d, one batch of %d per partition: %d); /readyz while it could not read: %.300s", peak, bound, batch, limit, notReady)
	if peak > limit {
		t.Errorf("the outbox peaked at %d open records with --max-outbox-rows %d; want at most %d", peak, bound, limit)
	}
	if notReady == "" {
		t.Errorf("/readyz never answered 503 naming the relay during the 20 s of statement_timeout = 1ms")
	}
	var pending int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pack_count), 0) FROM kafkatx.outbox WHERE state IN ('pending', 'parked', 'packed')`).Scan(&pending); err != nil || pending != 0 {
		t.Errorf("%d open outbox records after orders exited at idle (%v), want 0", pending, err)
	}
	if hw := highWatermarks(t, brokers, events); hw < orders {
		t.Errorf("%d events published, want at least %d (one per order)", hw, orders)
	}
	if applied != orders {
		t.Errorf("%d orders applied, want %d", applied, orders)
	}
}
