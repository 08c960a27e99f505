package kafkatx

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A failover to a standby that asynchronous replication left behind, staged as an SRE would:
// a PostgreSQL cluster of the test's own, a streaming standby made with pg_basebackup, the
// standby cut off (its primary_conninfo pointed at a dead port) while the primary goes on
// committing and Kafka's committed offsets follow it, then the primary stopped (immediate) and
// the standby promoted. The consumer reaches the pair through one multi-host URL with
// target_session_attrs=read-write, as users do.
type failoverPair struct {
	primary, standby *testenv.OwnPostgres
	url              string // both, read-write
}

func stageFailoverPair(t *testing.T, conf string) *failoverPair {
	t.Helper()
	f := &failoverPair{primary: testenv.StartOwnPostgres(t, "hot_standby = on\nwal_keep_size = 256MB\n"+conf)}
	f.standby = f.primary.StartStandby(t)
	f.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		f.primary.Port, f.standby.Port)
	return f
}

func (f *failoverPair) exec(t *testing.T, url string, sqls ...string) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, sql := range sqls {
		if _, err := c.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

func (f *failoverPair) query(t *testing.T, url, sql string, dst ...any) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := c.QueryRow(context.Background(), sql).Scan(dst...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// catchUp waits until the standby has replayed everything the primary has written so far.
func (f *failoverPair) catchUp(t *testing.T) {
	t.Helper()
	var at string
	f.query(t, f.primary.URL, `SELECT pg_current_wal_lsn()::text`, &at)
	waitFor(t, 60*time.Second, "the standby replaying the primary's WAL up to "+at, func() bool {
		var ok bool
		f.query(t, f.standby.URL, `SELECT coalesce(pg_last_wal_replay_lsn() >= '`+at+`'::pg_lsn, false)`, &ok)
		return ok
	})
}

// cutOff partitions the standby from the primary: it stops receiving WAL.
func (f *failoverPair) cutOff(t *testing.T) {
	t.Helper()
	f.exec(t, f.standby.URL, `ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 user=postgres'`, `SELECT pg_reload_conf()`)
	waitFor(t, 30*time.Second, "the standby's WAL receiver gone", func() bool {
		var n int64
		f.query(t, f.standby.URL, `SELECT count(*) FROM pg_stat_wal_receiver`, &n)
		return n == 0
	})
}

// failover stops the primary as if it died and promotes the standby.
func (f *failoverPair) failover(t *testing.T) {
	t.Helper()
	f.primary.Stop(t, "immediate")
	f.standby.Promote(t)
}

// failoverBundle is a testBundle on the pair's multi-host URL with kafkatx's schema, the
// effects table and an outbox, created on the primary before the standby copies it.
func failoverBundle(t *testing.T, f *failoverPair, partitions int) *testBundle {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, dbURL: f.url, schema: "kafkatx", brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, partitions)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	return b
}

// effectWithEvent applies m's effect and writes one outbox record for it through
// outbox.WriteTx (table mode), whose value names m.
func effectWithEvent(schema string) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := applyEffect(ctx, tx, schema, m); err != nil {
			return err
		}
		_, err := outbox.WriteTx(ctx, tx, outbox.Record{Topic: "events", Key: m.Key, Value: []byte(fmt.Sprintf("%d/%d", m.Partition, m.Offset))})
		return err
	}
}

// eventIDs maps each outbox record's value ("partition/offset") to its outbox_id.
func eventIDs(t *testing.T, url string) map[string]string {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	rows, err := c.Query(context.Background(), `SELECT convert_from(value, 'UTF8'), outbox_id::text FROM kafkatx.outbox`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var v, id string
		if err := rows.Scan(&v, &id); err != nil {
			t.Fatal(err)
		}
		if old, dup := out[v]; dup {
			t.Fatalf("two outbox rows for %s (%s, %s)", v, old, id)
		}
		out[v] = id
	}
	return out
}

// sameIDs fails unless every event written on the old primary for an input that the new
// primary also holds carries the same outbox_id there.
func sameIDs(t *testing.T, before, after map[string]string, lost int) {
	t.Helper()
	n := 0
	for v, id := range before {
		got, ok := after[v]
		if !ok {
			t.Fatalf("the new primary has no event for %s", v)
		}
		if got != id {
			t.Fatalf("the event of %s has outbox_id %s on the old primary and %s after re-processing: a consumer deduplicating by kafkatx-outbox-id would see it twice", v, id, got)
		}
		n++
	}
	if n < lost {
		t.Fatalf("compared %d events, fewer than the %d lost ones", n, lost)
	}
}

// failoverRun drains 100 messages per partition of 2 into the primary, cuts the standby off,
// drains 100 more (Kafka's committed offsets at 200), and returns the events the primary
// holds. The consumer keeps running.
func failoverDrain(t *testing.T, f *failoverPair, b *testBundle) map[string]string {
	t.Helper()
	for p := int32(0); p < 2; p++ {
		produce(t, b.brokers, b.topic, values(100, p, func(i int) string { return fmt.Sprint(i) }))
	}
	waitFor(t, 60*time.Second, "200 effects on the primary", func() bool { return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 200 })
	f.catchUp(t)
	f.cutOff(t)
	for p := int32(0); p < 2; p++ {
		produce(t, b.brokers, b.topic, values(100, p, func(i int) string { return fmt.Sprint(100 + i) }))
	}
	waitFor(t, 60*time.Second, "400 effects on the primary and Kafka's committed offsets at 200", func() bool {
		k := b.committedOffsets(t, 2)
		return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 400 && k[0] == 200 && k[1] == 200
	})
	var n int64
	f.query(t, f.standby.URL, `SELECT count(*) FROM kafkatx.effects`, &n)
	if n != 200 {
		t.Fatalf("staging: the cut-off standby holds %d effects, want 200", n)
	}
	return eventIDs(t, f.primary.URL)
}

// failoverOutcome checks the new primary after the consumer caught up: every message applied
// exactly once, one rollback_replayed audit row [100, 200) per partition and no skip, the
// watermarks and Kafka's committed offsets at 200, and each event under its old id.
func failoverOutcome(t *testing.T, f *failoverPair, b *testBundle, before map[string]string) {
	t.Helper()
	try := func(sql string, args ...any) int64 { // the pool's connections to the old primary fail once each
		var n int64
		if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	waitFor(t, 90*time.Second, "400 effects on the new primary, watermarks at 200", func() bool {
		return try("SELECT count(*) FROM kafkatx.effects") == 400 &&
			try("SELECT count(*) FROM kafkatx.watermarks WHERE group_id = $1 AND next_offset = 200", b.group) == 2
	})
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d effects applied more than once on the new primary", n)
	}
	if n := b.q(t, "SELECT count(*) FROM kafkatx.offset_audit WHERE kind IN ('unexplained_skip', 'operator_skip')"); n != 0 {
		t.Fatalf("%d skip rows in the offset audit: the rollback was taken for a skip", n)
	}
	if n := b.q(t, "SELECT count(*) FROM kafkatx.offset_audit WHERE kind = 'rollback_replayed' AND from_offset = 100 AND to_offset = 200"); n != 2 {
		t.Fatalf("%d rollback_replayed [100, 200) audit rows, want one per partition", n)
	}
	waitFor(t, 30*time.Second, "Kafka's committed offsets at 200", func() bool {
		k := b.committedOffsets(t, 2)
		return k[0] == 200 && k[1] == 200
	})
	sameIDs(t, before, eventIDs(t, f.standby.URL), 400)
}

// TestFailoverRestartReprocessesTheLostRange: the consumer, stopped with the primary and
// restarted on the promoted standby, finds Kafka's committed offsets (200) ahead of the
// watermarks (100) with its own commit mark of this database: a rollback, not an operator's
// skip. It re-processes [100, 200) from the watermark — every message applied once, each
// event under the id it had on the old primary — and audits it as rollback_replayed. Then an
// operator's move with Kafka's own tools (no mark) is still followed and audited as an
// unexplained skip. Today's consumer follows Kafka and loses the range.
func TestFailoverRestartReprocessesTheLostRange(t *testing.T) {
	t.Parallel()
	f := stageFailoverPair(t, "")
	b := failoverBundle(t, f, 2)
	cfg := b.config(t)
	cfg.Batch.Size = 20
	r := b.start(t, effectWithEvent(b.schema), cfg)
	before := failoverDrain(t, f, b)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	f.failover(t)
	// Before the consumer starts, offsets status tells the rollback from a skip.
	standby, err := pgxpool.New(context.Background(), f.standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	sts, err := offsets.NewOperator(standby, k, b.schema).Status(context.Background(), b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sts {
		if s.State != offsetstate.DatabaseRolledBack || !s.Drifted() {
			t.Fatalf("offsets status of %s[%d] on the promoted standby: %s; want database_rolled_back (drift)", s.Topic, s.Partition, s.State)
		}
	}
	// Restarted, as a process that died with the primary: a new pool on the same URL.
	if b.pool, err = pgxpool.New(context.Background(), f.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.pool.Close)
	r = b.start(t, effectWithEvent(b.schema), cfg)
	failoverOutcome(t, f, b, before)
	if s := r.c.Stats(); s.RolledBackOffsets != 200 || s.SkippedOffsets != 0 {
		t.Fatalf("Stats: %d offsets re-processed after the rollback, %d skipped; want 200 and 0", s.RolledBackOffsets, s.SkippedOffsets)
	}
	// An operator's skip with Kafka's tools, after kafkatx's own marked commits.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprint(200 + i) }))
	b.setCommitted(t, 210)
	r = b.start(t, effectWithEvent(b.schema), cfg)
	waitFor(t, 60*time.Second, "the operator's skip followed and [210, 220) applied", func() bool {
		return b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE partition = 0") == 210
	})
	if n := b.q(t, "SELECT count(*) FROM kafkatx.offset_audit WHERE kind = 'unexplained_skip' AND from_offset = 200 AND to_offset = 210"); n != 1 {
		t.Fatalf("%d unexplained_skip [200, 210) rows: a Kafka-tool move must be followed and audited, not re-processed", n)
	}
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE partition = 0 AND \"offset\" >= 200 AND \"offset\" < 210"); n != 0 {
		t.Fatalf("%d effects of the range the operator skipped", n)
	}
}

// TestFailoverUnderARunningConsumerReseeks: the consumer keeps running through the failover
// and no message arrives after it. Its idle partitions' watermarks fall from 200 to 100 on the
// promoted standby; it notices by itself (the periodic check of idle partitions), seeks back
// and re-processes [100, 200) exactly once with the same event ids, and audits each range as
// rollback_replayed. Today's consumer stalls until a new message arrives.
func TestFailoverUnderARunningConsumerReseeks(t *testing.T) {
	t.Parallel()
	requireServices(t)
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("Concurrency %d", n), func(t *testing.T) { failoverUnderRunningConsumer(t, n) })
	}
}

func failoverUnderRunningConsumer(t *testing.T, concurrency int) {
	f := stageFailoverPair(t, "")
	b := failoverBundle(t, f, 2)
	cfg := b.config(t)
	cfg.Batch.Size = 20
	cfg.Concurrency = concurrency
	r := b.start(t, effectWithEvent(b.schema), cfg)
	before := failoverDrain(t, f, b)
	f.failover(t)
	failoverOutcome(t, f, b, before)
	if s := r.c.Stats(); s.RolledBackOffsets != 200 || s.SkippedOffsets != 0 {
		t.Fatalf("Stats: %d offsets re-processed after the rollback, %d skipped; want 200 and 0", s.RolledBackOffsets, s.SkippedOffsets)
	}
}

// TestLostCommitAnswerAcrossAFailoverIsSettledOnTheNewPrimary: a COMMIT waits for a
// synchronous standby that does not exist, its answer is lost (the network cut), the primary
// dies with it and a standby that never received the transaction is promoted. The loop settles
// the outcome on the new primary: the xid is in the new primary's future (txid_status raises),
// or — after the new primary gave out as many xids — another transaction's, which txid_status
// reports committed while the watermark says otherwise. Either way the transaction did not
// commit there: the loop runs it again, once; it neither hangs nor loses the message, and is
// not fenced. Today's loop waits for ever in the first case and takes the second for
// committed.
func TestLostCommitAnswerAcrossAFailoverIsSettledOnTheNewPrimary(t *testing.T) {
	t.Parallel()
	for _, reused := range []bool{false, true} {
		name := "xid in the new primary's future"
		if reused {
			name = "xid reused by the new primary"
		}
		t.Run(name, func(t *testing.T) { lostCommitAcrossFailover(t, reused) })
	}
}

func lostCommitAcrossFailover(t *testing.T, reused bool) {
	f := stageFailoverPair(t, "synchronous_commit = on")
	ctx := context.Background()
	proxy := newCutProxy(t, fmt.Sprintf("127.0.0.1:%d", f.primary.Port))
	viaProxy := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", proxy.ln.Addr())
	pool, err := pgxpool.New(ctx, viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, dbURL: viaProxy, schema: "kafkatx", brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, 1)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	produce(t, b.brokers, b.topic, values(4, 0, func(i int) string { return fmt.Sprint(i) }))
	var calls [5]atomic.Int32
	release := make(chan struct{})
	var fenced atomic.Int32
	cfg := b.config(t)
	cfg.Hooks = []Hook{fenceCounter{&fenced}}
	cfg.Batch.Size = 1
	b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		calls[m.Offset].Add(1)
		if m.Offset == 3 && calls[3].Load() == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "offsets 0-2 applied and offset 3's handler running", func() bool {
		return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 3 && calls[3].Load() == 1
	})
	f.catchUp(t)
	f.cutOff(t) // the standby has offsets 0-2, never offset 3
	f.exec(t, f.primary.URL, `ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'`, `SELECT pg_reload_conf()`)
	time.Sleep(time.Second)
	close(release)
	var xid int64
	waitFor(t, 30*time.Second, "offset 3's COMMIT waiting for the standby", func() bool {
		var n int64
		f.query(t, f.primary.URL, `SELECT count(*), coalesce(max(backend_xid::text::bigint), 0) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`, &n, &xid)
		return n == 1
	})
	proxy.cut() // the loop loses the COMMIT's answer
	f.failover(t)
	if reused {
		// The new primary gives out the lost transaction's xid (and more) to others.
		c, err := pgx.Connect(ctx, f.standby.URL)
		if err != nil {
			t.Fatal(err)
		}
		for {
			var cur int64
			if err := c.QueryRow(ctx, `SELECT txid_current()`).Scan(&cur); err != nil {
				t.Fatal(err)
			}
			if cur > xid+2 {
				break
			}
		}
		var st string
		if err := c.QueryRow(ctx, `SELECT txid_status($1)`, xid).Scan(&st); err != nil || st != "committed" {
			t.Fatalf("staging: txid_status(%d) on the new primary = %q, %v; want another transaction's committed", xid, st, err)
		}
		c.Close(ctx)
	}
	proxy.retarget(fmt.Sprintf("127.0.0.1:%d", f.standby.Port))
	proxy.down.Store(false)
	waitFor(t, 60*time.Second, "offset 3 applied on the new primary, watermark 4", func() bool {
		return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 4 && b.q(t, "SELECT coalesce(max(next_offset), 0) FROM kafkatx.watermarks") == 4
	})
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE applied <> 1") + b.q(t, "SELECT count(*) FROM kafkatx.dead_letters"); n != 0 {
		t.Fatalf("%d effects applied twice or dead letters", n)
	}
	if n := calls[3].Load(); n != 2 {
		t.Fatalf("offset 3's handler ran %d times; want 2 (once on the old primary, lost with it; once on the new)", n)
	}
	if fenced.Load() != 0 {
		t.Fatalf("%d fences: the loop took the lost transaction for committed and found out later", fenced.Load())
	}
	if n := b.q(t, "SELECT count(*) FROM kafkatx.offset_audit WHERE kind = 'rollback_replayed'"); n != 0 {
		t.Fatalf("%d rollback_replayed rows: the loop took the lost transaction for committed", n)
	}
}
