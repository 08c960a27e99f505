package relay

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A row written with plain SQL (as a service in another language would) is published, woken
// by the NOTIFY trigger (the poll interval is too long to explain the latency), with the
// row's outbox_id as the kafkatx-outbox-id header and the bytes as written.
func TestPlainSQLInsertIsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 3, map[string]string{"message.timestamp.type": "LogAppendTime"})
	cfg := b.config(t)
	cfg.PollInterval = time.Hour // only the NOTIFY wakes it within the waits below
	r, _ := b.start(t, cfg)
	waitFor(t, 60*time.Second, "leadership", func() bool { return r.Stats().Leader })

	for i := 0; i < 20; i++ {
		_, err := b.pool.Exec(context.Background(), `INSERT INTO `+b.t.Outbox+` (topic, key, value) VALUES ($1, $2::bytea, $3::bytea)`,
			topic, fmt.Sprintf("k%d", i), []byte("hello\x00from sql"))
		if err != nil {
			t.Fatalf("plain insert: %v", err)
		}
		waitFor(t, 60*time.Second, "the row published", func() bool { return r.Stats().Published == int64(i+1) })
	}
	msgs := readAll(t, b.brokers, topic)
	if len(msgs) != 20 {
		t.Fatalf("topic holds %d records, want 20", len(msgs))
	}
	created := map[string]time.Time{}
	rows, err := b.pool.Query(context.Background(), `SELECT outbox_id::text, created_at FROM `+b.t.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	var oid string
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&oid, &at}, func() error { created[oid] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	var lat []time.Duration
	for _, m := range msgs {
		id, ok := header(m, outbox.HeaderOutboxID)
		at, found := created[id]
		if !ok || !found {
			t.Fatalf("record %v has kafkatx-outbox-id %q (present %v), not a row's outbox_id", m.TopicPartition, id, ok)
		}
		delete(created, id)
		if !bytes.Equal(m.Value, []byte("hello\x00from sql")) {
			t.Fatalf("value %q, want the bytes written", m.Value)
		}
		lat = append(lat, m.Timestamp.Sub(at)) // broker append time minus insert time (same host clock)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("insert to broker append (NOTIFY wake-up; poll interval 1m), 20 single-row transactions: p50 %s, max %s",
		lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
	if lat[len(lat)/2] > time.Second {
		t.Fatalf("median latency %s: the NOTIFY did not wake the relay", lat[len(lat)/2])
	}
}

// Writers whose ids commit out of order: a transaction that took a low id commits after a
// higher id was already published. Nothing is skipped.
func TestRowsCommittedOutOfOrderAreNotSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	r, _ := b.start(t, b.config(t))
	ctx := context.Background()

	// Deterministic case: a low id held open across a published higher id.
	slow, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx) //nolint:errcheck
	lowIDs, err := b.w.WriteTx(ctx, slow, outbox.Record{Topic: topic, Key: []byte("slow"), Value: []byte("low id")})
	if err != nil {
		t.Fatal(err)
	}
	highIDs := b.write(t, outbox.Record{Topic: topic, Key: []byte("fast"), Value: []byte("high id")})
	if highIDs[0] <= lowIDs[0] {
		t.Fatalf("ids %d, %d: want the second higher", lowIDs[0], highIDs[0])
	}
	waitFor(t, 60*time.Second, "the higher id published", func() bool { return b.states(t)[highIDs[0]] == "published" })
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the lower id, committed later, published", func() bool { return b.states(t)[lowIDs[0]] == "published" })

	// Many writers: each transaction takes its ids, then sleeps a random time before commit.
	const writers, perWriter = 8, 40
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		go func(w int) {
			for i := 0; i < perWriter; i++ {
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					_, err := b.w.WriteTx(ctx, tx, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("w%d-%d", w, i%3)), Value: []byte("x")},
						outbox.Record{Topic: topic, Value: []byte("nil key")})
					time.Sleep(time.Duration((w*7+i*13)%20) * time.Millisecond)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}(w)
	}
	for w := 0; w < writers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	total := int64(2 + writers*perWriter*2)
	waitFor(t, 30*time.Second, "every row published", func() bool { return r.Stats().Published >= total })
	for id, st := range b.states(t) {
		if st != "published" {
			t.Errorf("row %d is %s", id, st)
		}
	}
	msgs := readAll(t, b.brokers, topic)
	seen := map[string]int{}
	for _, m := range msgs {
		id, _ := header(m, outbox.HeaderOutboxID)
		seen[id]++
	}
	for row, id := range b.outboxIDs(t) {
		if seen[id] != 1 {
			t.Errorf("row %d (outbox id %s) published %d times, want once", row, id, seen[id])
		}
	}
	if int64(len(msgs)) != total {
		t.Fatalf("topic holds %d records, want %d", len(msgs), total)
	}
}

// Keyed records land on the partition Java's default partitioner picks:
// toPositive(murmur2(key)) % partitions.
func TestKeyedRecordsArePartitionedWithMurmur2(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const parts = 7
	topic := testenv.Topic(t, b.brokers, parts)
	b.start(t, b.config(t))
	var recs []outbox.Record
	for i := 0; i < 200; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("order-%d", i)), Value: []byte("v")})
	}
	two := int32(2)
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("order-0"), Value: []byte("explicit"), Partition: &two})
	b.write(t, recs...)
	waitCount(t, b.brokers, topic, int64(len(recs)), 60*time.Second)
	for _, m := range readAll(t, b.brokers, topic) {
		want := int32(murmur2(m.Key)&0x7fffffff) % parts
		if string(m.Value) == "explicit" {
			want = 2
		}
		if m.TopicPartition.Partition != want {
			t.Errorf("key %q on partition %d, want %d", m.Key, m.TopicPartition.Partition, want)
		}
	}
}

// Nil keys stay nil, empty values stay empty, nil values are tombstones, headers keep their
// bytes and order, and a row's own kafkatx-outbox-id header is replaced by the relay's.
func TestRecordBytesArePublishedAsWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	b.start(t, b.config(t))
	hs := []outbox.Header{{Key: "a", Value: []byte{0, 0xff, 'x'}}, {Key: outbox.HeaderOutboxID, Value: []byte("forged")}, {Key: "a", Value: []byte("second")}, {Key: "empty", Value: nil}}
	ids := b.write(t,
		outbox.Record{Topic: topic, Key: nil, Value: []byte("nil key"), Headers: hs},
		outbox.Record{Topic: topic, Key: []byte{}, Value: []byte{}},
		outbox.Record{Topic: topic, Key: []byte("tomb"), Value: nil},
	)
	waitCount(t, b.brokers, topic, 3, 60*time.Second)
	msgs := readAll(t, b.brokers, topic)
	oids := b.outboxIDs(t)
	m := msgs[0]
	if m.Key != nil || string(m.Value) != "nil key" {
		t.Fatalf("record 0: key %q (nil %v) value %q", m.Key, m.Key == nil, m.Value)
	}
	want := []kafka.Header{{Key: "a", Value: []byte{0, 0xff, 'x'}}, {Key: "a", Value: []byte("second")}, {Key: "empty", Value: []byte{}},
		{Key: outbox.HeaderOutboxID, Value: []byte(oids[ids[0]])}}
	if len(m.Headers) != len(want) {
		t.Fatalf("headers %v, want %v", m.Headers, want)
	}
	for i := range want {
		if m.Headers[i].Key != want[i].Key || !bytes.Equal(m.Headers[i].Value, want[i].Value) {
			t.Fatalf("header %d = %v, want %v", i, m.Headers[i], want[i])
		}
	}
	if m := msgs[1]; m.Key == nil || len(m.Key) != 0 || m.Value == nil || len(m.Value) != 0 {
		t.Fatalf("record 1: key %v value %v, want empty non-nil", m.Key, m.Value)
	}
	if m := msgs[2]; m.Value != nil {
		t.Fatalf("record 2: value %v, want nil (tombstone)", m.Value)
	}
}

// The dead-letter round trip at the database and outbox level: a dead letter, replayed with
// `dlq replay`'s code, becomes one outbox row with the original bytes and is published; the
// dead letter is marked replayed with an audit row; and dlq.Record publishes the DLQ
// record with its headers.
func TestDeadLetterReplayRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := testenv.Topic(t, b.brokers, 3)
	dlqTopic := testenv.Topic(t, b.brokers, 1)
	r, _ := b.start(t, b.config(t))
	ctx := context.Background()
	d := deadLetterFixture(src)
	var dlID int64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if dlID, _, err = insertDeadLetter(ctx, tx, b.schema, d); err != nil {
			return err
		}
		d.ID = dlID
		_, err = b.w.WriteTx(ctx, tx, dlq.Record(dlqTopic, d))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(t, b.brokers, dlqTopic, 1, 60*time.Second)
	dm := readAll(t, b.brokers, dlqTopic)[0]
	if dm.Key != nil || !bytes.Equal(dm.Value, d.Value) {
		t.Fatalf("DLQ record key %v value %q, want nil and the original bytes", dm.Key, dm.Value)
	}
	for k, want := range map[string]string{dlq.HeaderOriginalTopic: src, dlq.HeaderOriginalPartition: "2",
		dlq.HeaderOriginalOffset: "41", dlq.HeaderGroup: "g", dlq.HeaderAttempts: "5",
		dlq.HeaderOriginalOutboxID: "original-id", "trace": "\x00\x01"} {
		if got, _ := header(dm, k); got != want {
			t.Errorf("DLQ header %s = %q, want %q", k, got, want)
		}
	}

	var row int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = dlq.ReplayTx(ctx, tx, b.schema, dlID, dlq.Replay{Reason: "parser fixed", Actor: "test"})
		return err
	})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	waitFor(t, 60*time.Second, "the replayed row published", func() bool { return b.states(t)[row] == "published" })
	waitCount(t, b.brokers, src, 1, 60*time.Second)
	rm := readAll(t, b.brokers, src)
	if len(rm) != 1 {
		t.Fatalf("source topic holds %d records, want 1", len(rm))
	}
	if rm[0].Key != nil || !bytes.Equal(rm[0].Value, d.Value) {
		t.Fatalf("replayed key %v value %q, want nil and the original bytes", rm[0].Key, rm[0].Value)
	}
	if v, _ := header(rm[0], "trace"); v != "\x00\x01" {
		t.Fatalf("replayed header trace = %q", v)
	}
	if id, _ := header(rm[0], outbox.HeaderOutboxID); id != b.outboxIDs(t)[row] {
		t.Fatalf("replayed record's kafkatx-outbox-id %q, want its new row's id (not the original's)", id)
	}
	var status, action, reason string
	var auditRow int64
	err = b.pool.QueryRow(ctx, `SELECT d.status, a.action, a.reason, a.outbox_row FROM `+b.t.DeadLetters+` d
		JOIN `+pgx.Identifier{b.schema, "dlq_audit"}.Sanitize()+` a ON a.dead_letter_id = d.id WHERE d.id = $1`, dlID).Scan(&status, &action, &reason, &auditRow)
	if err != nil {
		t.Fatal(err)
	}
	if status != "replayed" || action != "replay" || reason != "parser fixed" || auditRow != row {
		t.Fatalf("dead letter %s, audit %s %q row %d", status, action, reason, auditRow)
	}
	// A second replay is refused unless asked for.
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := dlq.ReplayTx(ctx, tx, b.schema, dlID, dlq.Replay{Reason: "again", Actor: "test"})
		return err
	})
	if err == nil {
		t.Fatal("a second replay without Again succeeded")
	}
	_ = r
}

// Backlog counts pending rows, not parked ones nor those waiting behind them; the janitor
// deletes old published rows, old attempts and old resolved dead letters, and nothing else.
func TestBacklogAndJanitor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r, err := New(b.pool, b.config(t))
	if err != nil {
		t.Fatal(err)
	}
	topic := "not-published-in-this-test"
	ids := b.write(t,
		outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("1")},
		outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("2")},
		outbox.Record{Topic: topic, Key: []byte("b"), Value: []byte("3")},
		outbox.Record{Topic: topic, Value: []byte("4")},
	)
	n, age, err := r.Backlog(ctx)
	if err != nil || n != 4 || age <= 0 {
		t.Fatalf("Backlog = %d, %s, %v; want 4 rows, positive age", n, age, err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.t.Outbox+` SET state = 'parked' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if n, _, _ = r.Backlog(ctx); n != 2 {
		t.Fatalf("Backlog with key a parked = %d, want 2 (b and the nil key)", n)
	}
	if pending, err := r.Pending(ctx); err != nil || !pending {
		t.Fatalf("Pending = %v, %v; want true (b and the nil key wait)", pending, err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE `+b.t.Outbox+` SET state = 'published', resolved_at = now() - interval '2 days' WHERE id = $1`, ids[2])
	exec(`UPDATE `+b.t.Outbox+` SET state = 'published', resolved_at = now() WHERE id = $1`, ids[3])
	exec(`INSERT INTO ` + b.t.Attempts + ` (group_id, topic, partition, "offset", attempts, updated_at) VALUES
		('g', 't', 0, 1, 1, now() - interval '8 days'), ('g', 't', 0, 2, 1, now())`)
	for i, st := range []string{"replayed", "discarded", "new", "replayed"} {
		d := deadLetterFixture("t")
		d.Offset = int64(i)
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, _, err := insertDeadLetter(ctx, tx, b.schema, d); return err })
		if err != nil {
			t.Fatal(err)
		}
		age := "31 days"
		if i == 3 {
			age = "1 day"
		}
		exec(`UPDATE `+b.t.DeadLetters+` SET status = $1, resolved_at = now() - $2::interval, created_at = now() - interval '60 days' WHERE "offset" = $3`, st, age, i)
	}
	r.cfg.Janitor.BatchSize = 1 // several small batches
	if err := r.Clean(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(table, where string) int {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count(b.t.Outbox, "true"); got != 3 {
		t.Errorf("outbox rows after janitor = %d, want 3 (the old published row deleted)", got)
	}
	if got := count(b.t.Outbox, fmt.Sprintf("id = %d", ids[2])); got != 0 {
		t.Errorf("old published row still there")
	}
	if got := count(b.t.Attempts, "true"); got != 1 {
		t.Errorf("attempts rows after janitor = %d, want 1", got)
	}
	if got := count(b.t.DeadLetters, "true"); got != 2 {
		t.Errorf("dead letters after janitor = %d, want 2 (new and recently replayed)", got)
	}
	if got := count(b.t.DeadLetters, "status = 'new'"); got != 1 {
		t.Errorf("the new dead letter was deleted")
	}
}

// Run owns its goroutines: none is left once it returned.
func TestRunLeavesNoGoroutines(t *testing.T) {
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	opts := goleak.IgnoreCurrent()
	r, stop := b.start(t, b.config(t))
	b.write(t, outbox.Record{Topic: topic, Value: []byte("x")})
	waitFor(t, 60*time.Second, "publish", func() bool { return r.Stats().Published == 1 })
	stop()
	goleak.VerifyNone(t, opts)
}

// By default a published row is deleted at once, with its transaction's bookkeeping row; a
// transaction with a parked row keeps its bookkeeping row. Rows written with the triggers
// disabled have no bookkeeping row: the janitor adopts them and they are published.
func TestPublishedRowsAreDeletedAndTriggerlessRowsAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.Kafka["message.max.bytes"] = 10000
	// The test runs the janitor's pass itself (r.Clean): a periodic pass — the first runs when
	// leadership is taken, and under load it ran late, adopting the triggerless row below
	// before the check that nothing publishes it without the janitor.
	cfg.Janitor.Disabled = true
	r, _ := b.start(t, cfg)
	b.write(t, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("1")}, outbox.Record{Topic: topic, Value: []byte("2")})
	b.write(t, outbox.Record{Topic: topic, Key: []byte("b"), Value: []byte("3")})
	parked := b.write(t, outbox.Record{Topic: topic, Key: []byte("c"), Value: bytes.Repeat([]byte("z"), 20000)})
	commits := pgx.Identifier{b.schema, "outbox_commits"}.Sanitize()
	count := func(sql string) int {
		var n int
		if err := b.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 60*time.Second, "three published, one parked", func() bool { return r.Stats().Published == 3 && r.Stats().Parked == 1 })
	if n := count(`SELECT count(*) FROM ` + b.t.Outbox); n != 1 {
		t.Fatalf("%d outbox rows left, want only the parked one", n)
	}
	if n := count(`SELECT count(*) FROM ` + commits); n != 1 {
		t.Fatalf("%d outbox_commits rows left, want only the parked row's transaction", n)
	}
	if st := b.states(t)[parked[0]]; st != "parked" {
		t.Fatalf("row %d is %s", parked[0], st)
	}

	exec := func(sql string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`ALTER TABLE ` + b.t.Outbox + ` DISABLE TRIGGER outbox_written`)
	exec(`INSERT INTO ` + b.t.Outbox + ` (topic, key, value) VALUES ('` + topic + `', 'd', 'no trigger')`)
	exec(`ALTER TABLE ` + b.t.Outbox + ` ENABLE TRIGGER outbox_written`)
	time.Sleep(1500 * time.Millisecond) // several polls: not visible to the relay without a commit row
	if r.Stats().Published != 3 {
		t.Fatal("a row without a commit row was published before the janitor adopted it")
	}
	// The janitor adopts only transactions older than every snapshot's xmin, and the xmin is
	// the whole cluster's: a transaction another test holds open defers the adoption to a
	// later pass, so the test runs passes until the row is published (as the periodic
	// janitor would).
	waitFor(t, 120*time.Second, "the adopted row published", func() bool {
		if err := r.Clean(ctx); err != nil {
			t.Fatal(err)
		}
		return r.Stats().Published == 4
	})
	if n := topicCount(t, b.brokers, topic); n != 4 {
		t.Fatalf("topic holds %d records, want 4", n)
	}
}

func TestNewRefusesAConfigurationLibrdkafkaRefuses(t *testing.T) {
	for _, bad := range []kafka.ConfigMap{
		{"bootstrap.servers": "127.0.0.1:1", "bogus.property": "1"},
		{"bootstrap.servers": "127.0.0.1:1", "sasl.mechanism": "BOGUS", "security.protocol": "sasl_plaintext"},
	} {
		if _, err := New(new(pgxpool.Pool), &Config{Kafka: bad}); err == nil {
			t.Errorf("New accepted %v", bad)
		}
	}
}

// While the leader's rounds read full batches, Pending answers true without a query (asked
// here with a cancelled context, which any query would fail with); once the outbox is
// drained it queries again and answers false.
func TestPendingAnswersFromFullRoundsWithoutAQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.BatchSize = 10 // many full rounds
	var recs []outbox.Record
	for i := 0; i < 3000; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(strconv.Itoa(i % 7)), Value: []byte(strconv.Itoa(i))})
	}
	b.write(t, recs...)
	r, _ := b.start(t, cfg)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	answered := false
	waitFor(t, 60*time.Second, "every row published", func() bool {
		if pending, err := r.Pending(cancelled); err == nil && pending {
			answered = true
		}
		return r.Stats().Published >= 3000
	})
	if !answered {
		t.Fatal("Pending never answered true without a query while full rounds ran")
	}
	waitFor(t, 60*time.Second, "Pending false once drained", func() bool {
		pending, err := r.Pending(context.Background())
		return err == nil && !pending
	})
}
