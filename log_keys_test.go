package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue "Kafka's side of the history", the rest of the data model: every row keyed by an
// offset knows which log the offset is in. These tests recreate the topic under the same
// name, adopt the new log (Config.OnLogChange; `kafkatx offsets reset --mode adopt` runs the
// same offsetstore.AdoptLog) and send the new log's messages through the offsets the old
// log's rows hold.

// pillHandler applies every message but those whose value starts with "pill", which it
// rejects permanently.
func pillHandler(schema string) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if strings.HasPrefix(string(m.Value), "pill") {
			return Permanent(fmt.Errorf("poison pill %s", m.Value))
		}
		return applyEffect(ctx, tx, schema, m)
	}
}

// Before, dead_letters was unique on (group, topic, partition, offset): the new log's pill at
// the old one's offset overwrote the old dead letter — its bytes lost, its 'discarded' status
// turned back to 'new'.
func TestDeadLetterOfAnAdoptedLogDoesNotOverwriteTheOldLogs(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(3, 0, func(i int) string { return map[bool]string{true: "pill-old", false: "{}"}[i == 1] }))
	b.runUntilWatermark(t, pillHandler(b.schema), b.config(t), 3)
	oldID := b.qs(t, "SELECT coalesce(topic_id, '') FROM {{schema}}.watermarks")
	old := b.deadLetters(t)
	if len(old) != 1 || old[0].Offset != 1 || old[0].TopicID != oldID || oldID == "" {
		t.Fatalf("dead letters after the old log: %+v, want one at offset 1 in log %q", old, oldID)
	}
	b.discard(t, old[0].ID)

	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(4, 0, func(i int) string { return map[bool]string{true: "pill-new", false: "{}"}[i == 1] }))
	cfg := b.config(t)
	cfg.OnLogChange = LogChangeAdoptEarliest
	b.runUntilWatermark(t, pillHandler(b.schema), cfg, 4)
	newID := b.qs(t, "SELECT coalesce(topic_id, '') FROM {{schema}}.watermarks")
	if newID == oldID || newID == "" {
		t.Fatalf("topic id after the adoption %q, want a new one (old %q)", newID, oldID)
	}

	ds := b.deadLetters(t)
	if len(ds) != 2 {
		t.Fatalf("%d dead letters at offset 1 after the new log's pill, want 2 (the old log's kept): %+v", len(ds), ds)
	}
	if d := ds[0]; string(d.Value) != "pill-old" || d.Status != dlq.StatusDiscarded || d.TopicID != oldID || d.ID != old[0].ID {
		t.Errorf("the old log's dead letter is now %q %s in log %q (id %d), want pill-old discarded in %q (id %d)", d.Value, d.Status, d.TopicID, d.ID, oldID, old[0].ID)
	}
	if d := ds[1]; d.Offset != 1 || string(d.Value) != "pill-new" || d.Status != dlq.StatusNew || d.TopicID != newID || d.ClusterID == "" {
		t.Errorf("the new log's dead letter is %q %s at %d in log %q/%q, want pill-new new at 1 in %q", d.Value, d.Status, d.Offset, d.TopicID, d.ClusterID, newID)
	}
	if v := dlq.ViewOf(&ds[1], false); v.TopicID != newID {
		t.Errorf("dlq.View of the new dead letter names log %q, want %q", v.TopicID, newID)
	}

	// A replay of the old log's dead letter publishes its bytes to the topic by name: into
	// the log there now, as a new record (docs/offsets.md). It is not a conflict with the
	// new log's dead letter of the same offset.
	b.exec(t, "UPDATE {{schema}}.dead_letters SET status = 'new' WHERE id = $1", old[0].ID)
	tx, err := b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	row, _, err := dlq.ReplayTx(context.Background(), tx, b.schema, old[0].ID, dlq.Replay{Reason: "test", Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.outbox WHERE id = $1 AND topic = $2 AND value = 'pill-old'", row, b.topic); n != 1 {
		t.Fatalf("the replay of the old log's dead letter wrote %d outbox rows to %s with its bytes, want 1", n, b.topic)
	}
}

// The old log's attempt counters and done marks (Config.Concurrency > 1) at or above its
// watermark — what a crash during a retry leaves — must not meet the new log's messages at
// those offsets: a counter would dead-letter a healthy message early, a done mark would skip
// it. The adoption drops both in its transaction; this test plants them as a crash leaves
// them and proves neither counts.
func TestAnAdoptedLogMeetsNoneOfTheOldLogsAttemptsOrDoneMarks(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(2, 0, func(i int) string { return "{}" }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 2)
	// Offset 2 of the old log failed 4 times (MaxAttempts 5: one more and it is dead-lettered);
	// offset 3 was applied above the watermark by a unit of Concurrency > 1.
	b.exec(t, `INSERT INTO {{schema}}.attempts (group_id, topic, partition, "offset", attempts, first_failure_at, last_failure_at, error_class, error_message)
		VALUES ($1, $2, 0, 2, 4, now(), now(), 'transient', 'old log')`, b.group, b.topic)
	b.exec(t, `INSERT INTO {{schema}}.done_offsets (group_id, topic, partition, "offset") VALUES ($1, $2, 0, 3)`, b.group, b.topic)

	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint(`{"new":`, i, `}`) }))
	var mu sync.Mutex
	failed := map[int64]bool{}
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		mu.Lock()
		first := !failed[m.Offset]
		failed[m.Offset] = true
		mu.Unlock()
		if m.Offset == 2 && first {
			return errors.New("a transient failure of the new log's offset 2, its first")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.OnLogChange = LogChangeAdoptEarliest
	b.runUntilWatermark(t, h, cfg, 5)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("%d dead letters: the old log's 4 attempts counted against the new log's offset 2", n)
	}
	// The effects table is keyed by offset: the old log applied 0 and 1 once each.
	for off, want := range []int64{2, 2, 1, 1, 1} {
		if n := b.q(t, `SELECT coalesce(sum(applied), 0) FROM {{schema}}.effects WHERE "offset" = $1`, off); n != want {
			t.Errorf("offset %d applied %d times, want %d: the new log's message skipped (the old log's done mark at 3?) or applied twice", off, n, want)
		}
	}
}

// outboxHandler applies each message and writes one outbox record for it, whose id the loop
// derives from the message (outbox.SourceID).
func outboxHandler(schema string) Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if _, err := (outbox.Writer{Schema: schema}).WriteTx(m.Context(), tx, outbox.Record{Topic: "events", Value: m.Value}); err != nil {
			return err
		}
		return applyEffect(ctx, tx, schema, m)
	}
}

// Before, the new log's message at offset N got the outbox event id of the old log's message
// at N (v5 UUID of group/epoch, topic, partition, offset, position) and a downstream
// deduplicating by kafkatx-outbox-id dropped it. The ids are scoped by the log's topic id
// now; the replay epoch — the scope of business idempotency keys — stays, so an event
// claimed in the old log is not applied again from the new one.
func TestOutboxEventIdsOfAnAdoptedLogAreNew(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(3, 0, func(i int) string { return fmt.Sprint(`{"old":`, i, `}`) }))
	b.runUntilWatermark(t, outboxHandler(b.schema), b.config(t), 3)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(4, 0, func(i int) string { return fmt.Sprint(`{"new":`, i, `}`) }))
	cfg := b.config(t)
	cfg.OnLogChange = LogChangeAdoptEarliest
	b.runUntilWatermark(t, outboxHandler(b.schema), cfg, 4)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.outbox WHERE topic = 'events'"); n != 7 {
		t.Fatalf("%d outbox rows, want 7 (3 of the old log, 4 of the new)", n)
	}
	if n := b.q(t, "SELECT count(DISTINCT outbox_id) FROM {{schema}}.outbox WHERE topic = 'events'"); n != 7 {
		t.Fatalf("%d distinct event ids among 7 events of two logs: the new log's reused the old log's", n)
	}
	if e := b.q(t, "SELECT replay_epoch FROM {{schema}}.watermarks"); e != 0 {
		t.Fatalf("replay epoch %d after the adoption, want 0 (business keys claimed in the old log still count)", e)
	}
}

func (b *testBundle) deadLetters(t *testing.T) []dlq.DeadLetter {
	t.Helper()
	ds, err := dlq.List(context.Background(), b.pool, b.schema, dlq.Filter{Group: b.group})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func (b *testBundle) discard(t *testing.T, id int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := dlq.DiscardTx(ctx, tx, b.schema, id, dlq.Action{Reason: "test", Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// An adoption is no replay: a business idempotency key claimed in the old log (scope
// "group/epoch") still counts in the new one, so an event re-published into the recreated
// topic — or mirrored into another cluster — is not applied twice; an event new to the new log
// is applied.
func TestBusinessKeysClaimedInTheOldLogStillCountAfterAnAdoption(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	withID := func(ids ...string) []testRecord {
		out := make([]testRecord, len(ids))
		for i, id := range ids {
			out[i] = testRecord{value: []byte(id), headers: []kafka.Header{{Key: "event-id", Value: []byte(id)}}, partition: 0}
		}
		return out
	}
	cfg := b.config(t)
	cfg.Idempotency.Key = idempotency.FromHeader("event-id")
	produce(t, b.brokers, b.topic, withID("e1", "e2"))
	b.runUntilWatermark(t, b.handler(), cfg, 2)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, withID("e1", "e2", "e3"))
	cfg = b.config(t)
	cfg.Idempotency.Key = idempotency.FromHeader("event-id")
	cfg.OnLogChange = LogChangeAdoptEarliest
	b.runUntilWatermark(t, b.handler(), cfg, 3)
	if n := b.q(t, "SELECT coalesce(sum(applied), 0) FROM {{schema}}.effects"); n != 3 {
		t.Fatalf("%d applications, want 3: e1 and e2 once (claimed in the old log), e3 once", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" = 2 AND value = 'e3'`); n != 1 {
		t.Fatal("e3, new in the new log, was not applied")
	}
}
