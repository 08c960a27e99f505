package offsets

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

type testBundle struct {
	t       *testing.T
	pool    *pgxpool.Pool
	schema  string
	brokers string
	topic   string
	group   string
	tp      offsetstore.TP
	op      *Operator
	k       *Kafka
	park    bool // run's consumer parks keys (kafkatx.Config.Park)
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	b := &testBundle{t: t, pool: pool, schema: testenv.Schema(t, pool), brokers: testenv.Brokers(t), group: testenv.Group(t)}
	b.topic = testenv.Topic(t, b.brokers, 1)
	b.tp = offsetstore.TP{Topic: b.topic, Partition: 0}
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, b.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{b.schema, "effects"}.Sanitize()+` ("offset" bigint PRIMARY KEY, applied int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	k, err := NewKafka(kafka.ConfigMap{"bootstrap.servers": b.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	b.k, b.op = k, NewOperator(pool, k, b.schema)
	// Ten messages; the one at offset 3 fails every time.
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "enable.idempotence": true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, 10)
	for i := range 10 {
		v := "m" + strconv.Itoa(i)
		if i == 3 {
			v = "poison"
		}
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: 0}, Value: []byte(v)}, ch); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
	return b
}

func (b *testBundle) q(sql string, args ...any) int64 {
	b.t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), fmt.Sprintf(sql, pgx.Identifier{b.schema}.Sanitize()), args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *testBundle) watermark() int64 {
	return b.q(`SELECT coalesce(max(next_offset), -1) FROM %s.watermarks WHERE group_id = $1`, b.group)
}

func (b *testBundle) committed() int64 {
	b.t.Helper()
	c, err := b.k.Committed(context.Background(), b.group, []offsetstore.TP{b.tp})
	if err != nil {
		b.t.Fatal(err)
	}
	if v, ok := c[b.tp]; ok {
		return v
	}
	return -1
}

// run runs the consumer until cond holds, then stops it.
func (b *testBundle) run(what string, cond func() bool) {
	b.t.Helper()
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	c, err := kafkatx.NewConsumer(b.pool, func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		if string(m.Value) == "poison" {
			return errors.New("cannot decode")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` ("offset", applied) VALUES ($1, 1) ON CONFLICT ("offset") DO UPDATE SET applied = effects.applied + 1`, m.Offset)
		return err
	}, &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": b.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
		Topics: []string{b.topic},
		Schema: b.schema,
		Logger: zaptest.NewLogger(b.t, zaptest.Level(zap.ErrorLevel)),
		Retry:  kafkatx.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond},
		Park:   kafkatx.ParkConfig{Enabled: b.park},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		b.t.Fatal(err)
	}
}

func (b *testBundle) stuckAtPoison() {
	b.run("offset 3 to fail twice", func() bool {
		return b.q(`SELECT coalesce(max(attempts), 0) FROM %s.attempts WHERE group_id = $1 AND "offset" = 3`, b.group) >= 2
	})
}

var errCrash = errors.New("simulated crash between the Kafka move and the database transaction")

// marked reports whether the group's committed offset carries the consumer's commit mark.
func (b *testBundle) marked() bool {
	b.t.Helper()
	_, marks, err := b.k.CommittedMarks(context.Background(), b.group, []offsetstore.TP{b.tp})
	if err != nil {
		b.t.Fatal(err)
	}
	_, ok := marks[b.tp]
	return ok
}

// The command dies after moving Kafka's offset and before its database transaction: the
// consumer must recognise the move as the pending operator skip, not an unexplained one, and
// never as a database rollback — the consumer's own commits carry its commit mark, the
// command's move does not.
func TestResetSkipCrashAfterKafkaMoveIsFollowedAsOperatorSkip(t *testing.T) {
	b := setup(t)
	b.stuckAtPoison()
	ctx := context.Background()
	if !b.marked() {
		t.Fatal("the consumer's offset commit carries no commit mark")
	}
	plan, err := b.op.PlanReset(ctx, ResetRequest{Group: b.group, Topic: b.topic, Partition: 0, Target: Target{Kind: TargetOffset, Offset: 4}, Mode: ModeSkip, Reason: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	afterKafkaCommit = func() error { return errCrash }
	err = b.op.ExecuteReset(ctx, plan)
	afterKafkaCommit = nil
	if !errors.Is(err, errCrash) {
		t.Fatalf("ExecuteReset: %v", err)
	}
	if w, k := b.watermark(), b.committed(); w != 3 || k != 4 {
		t.Fatalf("after the crash: watermark %d, committed %d; want 3, 4", w, k)
	}
	if b.marked() {
		t.Fatal("offsets reset's Kafka move carries the consumer's commit mark: it would be taken for a database rollback")
	}
	sts, err := b.op.Status(ctx, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if s := sts[0]; s.State != offsetstate.KafkaAhead || len(s.Pending) != 1 || s.Pending[0].Kind != offsetstore.KindOperatorSkip {
		t.Fatalf("status after the crash: %+v; want kafka_ahead with one pending operator_skip", s)
	}
	b.run("watermark 10", func() bool { return b.watermark() == 10 })
	if n := b.q(`SELECT count(*) FROM %s.offset_audit WHERE kind = 'operator_skip' AND status = 'applied' AND from_offset = 3 AND to_offset = 4`); n != 1 {
		t.Fatal("the consumer did not apply the pending operator skip")
	}
	if n := b.q(`SELECT count(*) FROM %s.offset_audit WHERE kind IN ('unexplained_skip', 'rollback_replayed')`); n != 0 {
		t.Fatal("the command's skip was audited as unexplained or as a database rollback")
	}
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE "offset" = 3`); n != 0 {
		t.Fatal("the skipped message was processed")
	}
	accts, err := b.op.Account(ctx, b.group, b.topic, -1)
	if err != nil {
		t.Fatal(err)
	}
	if a := accts[0]; !a.Accounted() || a.OperatorSkipped != 1 || a.Processed != 9 {
		t.Fatalf("account: %+v", a)
	}
}

// A replay that dies after moving Kafka back is undone by the consumer (Kafka behind: it
// re-commits the watermark, nothing runs twice); running the same replay again reuses the
// pending audit row and completes.
func TestResetReplayCrashAfterKafkaMoveIsHarmlessAndCanBeRerun(t *testing.T) {
	b := setup(t)
	b.stuckAtPoison()
	ctx := context.Background()
	// Skip the pill first so the partition runs to the end.
	plan, err := b.op.PlanReset(ctx, ResetRequest{Group: b.group, Topic: b.topic, Partition: -1, Target: Target{Kind: TargetOffset, Offset: 4}, Mode: ModeSkip, Reason: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.op.ExecuteReset(ctx, plan); err != nil {
		t.Fatal(err)
	}
	b.run("watermark 10", func() bool { return b.watermark() == 10 })
	replay := ResetRequest{Group: b.group, Topic: b.topic, Partition: 0, Target: Target{Kind: TargetOffset, Offset: 6}, Mode: ModeReplay, Reason: "re-run"}
	plan, err = b.op.PlanReset(ctx, replay)
	if err != nil {
		t.Fatal(err)
	}
	afterKafkaCommit = func() error { return errCrash }
	err = b.op.ExecuteReset(ctx, plan)
	afterKafkaCommit = nil
	if !errors.Is(err, errCrash) {
		t.Fatalf("ExecuteReset: %v", err)
	}
	pendingID := plan.Steps[0].AuditID
	if w, k := b.watermark(), b.committed(); w != 10 || k != 6 {
		t.Fatalf("after the crash: watermark %d, committed %d; want 10, 6", w, k)
	}
	b.run("Kafka re-committed to the watermark", func() bool { return b.committed() == 10 })
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE applied <> 1`); n != 0 {
		t.Fatalf("%d messages ran twice after a replay that did not complete", n)
	}
	plan, err = b.op.PlanReset(ctx, replay)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.op.ExecuteReset(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if plan.Steps[0].AuditID != pendingID {
		t.Fatalf("the re-run wrote audit row %d instead of completing the pending row %d", plan.Steps[0].AuditID, pendingID)
	}
	b.run("watermark 10 after the replay", func() bool { return b.watermark() == 10 })
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE "offset" >= 6 AND applied = 2`); n != 4 {
		t.Fatalf("%d of the 4 replayed messages ran exactly twice", n)
	}
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE "offset" < 6 AND applied <> 1`); n != 0 {
		t.Fatalf("%d messages outside the replay window ran twice", n)
	}
	if n := b.q(`SELECT replay_epoch FROM %s.watermarks WHERE group_id = $1`, b.group); n != 1 {
		t.Fatalf("replay epoch %d, want 1", n)
	}
}

// Issue 36: a skip whose watermark update the database refuses (here a trigger; in life a
// revoked privilege, a moved watermark) is half applied: Kafka moved, the database did not.
// The command says so, its audit row is abandoned (not left pending for the consumer to
// finish as if the command had died), and offsets status describes it as a half-applied
// reset, not as a move with Kafka's own tools.
func TestResetSkipRefusedByTheDatabaseIsAbandonedAndDescribed(t *testing.T) {
	b := setup(t)
	b.stuckAtPoison()
	ctx := context.Background()
	plan, err := b.op.PlanReset(ctx, ResetRequest{Group: b.group, Topic: b.topic, Partition: 0, Target: Target{Kind: TargetOffset, Offset: 4}, Mode: ModeSkip, Reason: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	wm := pgx.Identifier{b.schema, "watermarks"}.Sanitize()
	fn := pgx.Identifier{b.schema, "refuse_watermark_update"}.Sanitize()
	afterKafkaCommit = func() error {
		_, err := b.pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'watermark updates are refused'; END $$;
			CREATE TRIGGER refuse BEFORE UPDATE ON `+wm+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
		return err
	}
	err = b.op.ExecuteReset(ctx, plan)
	afterKafkaCommit = nil
	if _, dropErr := b.pool.Exec(ctx, `DROP TRIGGER refuse ON `+wm); dropErr != nil {
		t.Fatal(dropErr)
	}
	if err == nil || !strings.Contains(err.Error(), "the watermark update was refused") || !strings.Contains(err.Error(), "marked abandoned") {
		t.Fatalf("ExecuteReset: %v, want the refusal named and the row abandoned", err)
	}
	if n := b.q(`SELECT count(*) FROM %s.offset_audit WHERE kind = 'operator_skip' AND status = 'abandoned' AND from_offset = 3 AND to_offset = 4`); n != 1 {
		t.Fatalf("%d abandoned operator_skip rows, want 1", n)
	}
	if w, k := b.watermark(), b.committed(); w != 3 || k != 4 {
		t.Fatalf("after the refusal: watermark %d, committed %d; want 3, 4", w, k)
	}
	sts, err := b.op.Status(ctx, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	hints := strings.Join(Hints(b.schema, b.group, sts, func(s string) string { return s }), "\n")
	if sts[0].State != offsetstate.KafkaAhead || len(sts[0].Pending) != 0 || !strings.Contains(hints, "half-applied `kafkatx offsets reset --mode skip`") ||
		strings.Contains(hints, "Kafka's own tools, or") {
		t.Fatalf("status: %+v\nhints: %s\nwant kafka_ahead, nothing pending, described as a half-applied reset", sts[0], hints)
	}
}
