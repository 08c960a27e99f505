package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A switchover under two relays, as it looks from the relays: mid-stream the database turns
// read-only (every session ended, as a failover does; the old primary answers every write with
// SQLSTATE 25006 and still accepts reads and advisory locks), then writable again without
// ending the sessions opened meanwhile, which stay read-only. While it is read-only no relay
// takes the leadership and nothing is published (a relay that published rows it cannot mark would publish
// them again every round for as long as the switch lasts); never two leaders at once
// (sampled every 10 ms); afterwards every row is published, none parked, and the copies on
// the topic (same outbox id) are at most the one round in flight at the switch.
func TestReadOnlySwitchUnderTwoRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, url, dbName, admin := ownDatabase(t)
	pool := b.pool
	topic := testenv.Topic(t, b.brokers, 3)
	const batch = 50
	leads, leadLogs := observer.New(zapcore.InfoLevel)
	relays := make([]*Relay, 2)
	for i := range relays {
		rp, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rp.Close)
		bb := *b
		bb.pool = rp
		cfg := b.config(t)
		cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), leads))
		cfg.BatchSize = batch
		cfg.MaxBackoff = 500 * time.Millisecond
		relays[i], _ = bb.start(t, cfg)
	}

	// Never two leaders.
	stopSampler := make(chan struct{})
	var both atomic.Int64
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stopSampler:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if relays[0].Stats().Leader && relays[1].Stats().Leader {
				both.Add(1)
			}
		}
	}()

	// A writer: 10 records per transaction until 3,000 are committed; writes refused while
	// the database is read-only are retried (they never committed).
	const total = 3000
	var written atomic.Int64
	writerDone := make(chan error, 1)
	go func() {
		for n := 0; n < total; {
			recs := make([]outbox.Record, 10)
			for i := range recs {
				recs[i] = outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", (n+i)%17)), Value: []byte(fmt.Sprint(n + i))}
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := b.w.WriteTx(ctx, tx, recs...)
				return err
			})
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				n += len(recs)
				written.Store(int64(n))
			case errors.As(err, &pgErr) && pgErr.Code == "25006", pgconn.SafeToRetry(err), isConnectionError(err):
				pool.Reset()
				time.Sleep(20 * time.Millisecond)
				continue
			default:
				writerDone <- err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		writerDone <- nil
	}()

	waitFor(t, 60*time.Second, "a third of the rows published", func() bool { return topicCount(t, b.brokers, topic) >= total/3 })
	db := pgx.Identifier{dbName}.Sanitize()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", dbName); err != nil {
		t.Fatal(err)
	}
	switched := time.Now()
	time.Sleep(time.Second) // the round in flight at the switch ends
	before := topicCount(t, b.brokers, topic)
	time.Sleep(3 * time.Second)
	during := topicCount(t, b.brokers, topic) - before
	switchedBack := time.Now()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	if err := <-writerDone; err != nil {
		t.Fatalf("writer: %v", err)
	}
	waitFor(t, 90*time.Second, "every row published", func() bool {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE state = 'published'`).Scan(&n)
		return n == total
	})
	close(stopSampler)
	sampler.Wait()

	var parked, pending int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'parked'), count(*) FILTER (WHERE state = 'pending') FROM `+b.t.Outbox).Scan(&parked, &pending); err != nil {
		t.Fatal(err)
	}
	msgs := readAll(t, b.brokers, topic)
	ids := map[string]int{}
	for _, m := range msgs {
		id, _ := header(m, outbox.HeaderOutboxID)
		ids[id]++
	}
	copies := len(msgs) - len(ids)
	readOnlyLeads := 0 // leaderships taken while the database was read-only
	for _, e := range leadLogs.FilterMessageSnippet("relay is the leader").All() {
		if e.Time.After(switched) && e.Time.Before(switchedBack) {
			readOnlyLeads++
		}
	}
	t.Logf("%d rows, %d records on the topic (%d distinct ids, %d copies); %d published while read-only; leaderships taken while read-only: %d; both leading in %d samples",
		total, len(msgs), len(ids), copies, during, readOnlyLeads, both.Load())
	switch {
	case len(ids) != total:
		t.Fatalf("%d distinct outbox ids on the topic, want %d", len(ids), total)
	case parked != 0 || pending != 0:
		t.Fatalf("%d rows parked, %d pending", parked, pending)
	case during != 0:
		t.Fatalf("%d records published while the database was read-only (rows that cannot be marked, published again every round)", during)
	case readOnlyLeads != 0:
		t.Fatalf("%d leaderships taken on the read-only database", readOnlyLeads)
	case both.Load() != 0:
		t.Fatalf("both relays led at once in %d samples", both.Load())
	case copies > batch:
		t.Fatalf("%d copies: more than the one round (%d rows) in flight at the switch", copies, batch)
	}
}

// ownDatabase returns a bundle on a database of the test's own (migrated, schema kafkatx), so
// that the test can turn the whole database read-only: its URL, its name, and a pool on the
// server's default database for the switch.
func ownDatabase(t *testing.T) (b *testBundle, url, dbName string, admin *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url = testenv.Database(t)
	dbName = url[strings.LastIndex(url, "/")+1:]
	if i := strings.IndexByte(dbName, '?'); i >= 0 {
		dbName = dbName[:i]
	}
	admin = testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b = &testBundle{pool: pool, schema: "kafkatx", brokers: testenv.Brokers(t), w: outbox.Writer{Schema: "kafkatx"}, t: tables.For("kafkatx")}
	if _, err := migrations.Apply(ctx, pool, b.schema); err != nil {
		t.Fatal(err)
	}
	return b, url, dbName, admin
}

// isConnectionError reports an error of a session the test's switch ended.
func isConnectionError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01"
	}
	return pgconn.Timeout(err) || strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "unexpected EOF") ||
		strings.Contains(err.Error(), "connection reset")
}

// Regression (CI, TestReadOnlySwitchUnderTwoRelays: 20 records published while read-only): a
// round that waited for the previous round's mark while the database turned read-only read
// the next rows on a fresh read-only session (reads still work there) and produced them,
// although the mark had just failed and the leadership session had ended: the fence ran only
// before the round, not before the produce. Here the mark of a first round (30 rows) is held
// while 20 more rows are written, so the next round is waiting for it; then the database
// turns read-only, every session ends, and the mark is let go (it fails). None of the 20 rows
// may be published until the database is writable again; afterwards all 50 are.
func TestNothingProducedAfterTheMarkFailedOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, url, dbName, admin := ownDatabase(t)
	pool := b.pool
	db := pgx.Identifier{dbName}.Sanitize()
	topic := testenv.Topic(t, b.brokers, 3)
	rp, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.Close)
	cfg := b.config(t)
	cfg.BatchSize = 50
	cfg.MaxBackoff = 500 * time.Millisecond
	r, err := New(rp, cfg)
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.testHookMark = func() { once.Do(func() { close(held); <-release }) }
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	write := func(from, n int) {
		t.Helper()
		recs := make([]outbox.Record, n)
		for i := range recs {
			recs[i] = outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", (from+i)%7)), Value: []byte(fmt.Sprint(from + i))}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := b.w.WriteTx(ctx, tx, recs...); return err }); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 30)
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("the first round's mark never started")
	}
	waitFor(t, 30*time.Second, "the first 30 records on the topic", func() bool { return topicCount(t, b.brokers, topic) == 30 })
	write(30, 20)
	time.Sleep(time.Second) // the leader wakes on the NOTIFY and its round waits for the held mark

	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "ALTER DATABASE "+db+" RESET default_transaction_read_only")
	})
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", dbName); err != nil {
		t.Fatal(err)
	}
	close(release)
	// The mark retries for about 3 s (five tries) before it fails; look past that.
	time.Sleep(6 * time.Second)
	if n := topicCount(t, b.brokers, topic); n != 30 {
		t.Fatalf("%d records on the topic after the failed mark on the read-only database, want the first round's 30 only", n)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "all 50 rows published", func() bool {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE state = 'published'`).Scan(&n)
		return n == 50
	})
	ids := map[string]bool{}
	for _, m := range readAll(t, b.brokers, topic) {
		id, _ := header(m, outbox.HeaderOutboxID)
		ids[id] = true
	}
	if len(ids) != 50 {
		t.Fatalf("%d distinct outbox ids on the topic, want 50", len(ids))
	}
}
