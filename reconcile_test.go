package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
)

// setCommitted moves the group's committed offset of partition 0 out of band, as an
// operator with Kafka's own tools would (Admin.alterConsumerGroupOffsets).
func (b *testBundle) setCommitted(t *testing.T, offset int64) {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.AlterConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{{Group: b.group,
		Partitions: []kafka.TopicPartition{{Topic: &b.topic, Partition: 0, Offset: kafka.Offset(offset)}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.ConsumerGroupsTopicPartitions {
		for _, p := range r.Partitions {
			if p.Error != nil {
				t.Fatal(p.Error)
			}
		}
	}
}

// deleteCommitted deletes the group's committed offsets on the broker.
func (b *testBundle) deleteCommitted(t *testing.T) {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.DeleteConsumerGroups(ctx, []string{b.group}); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) runUntilWatermark(t *testing.T, h Handler, cfg *Config, want int64) {
	t.Helper()
	r := b.start(t, h, cfg)
	waitFor(t, 60*time.Second, fmt.Sprintf("watermark %d", want), func() bool {
		return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == want
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) handler() Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }
}

func TestKafkaBehindOrMissingResumesFromTheWatermark(t *testing.T) {
	t.Parallel()
	requireServices(t)
	for _, tc := range []struct {
		name string
		move func(b *testBundle, t *testing.T)
		kind string
	}{
		{"rewound", func(b *testBundle, t *testing.T) { b.setCommitted(t, 2) }, "kafka_behind"},
		{"deleted", func(b *testBundle, t *testing.T) { b.deleteCommitted(t) }, "kafka_missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
			b.runUntilWatermark(t, b.handler(), b.config(t), 10)
			tc.move(b, t)
			produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint(i) }))
			cfg := b.config(t)
			core, logs := observer.New(zap.WarnLevel)
			cfg.Logger = zap.New(core)
			b.runUntilWatermark(t, b.handler(), cfg, 15)
			if tc.kind == "kafka_behind" { // issue 36: the consumer's own line quotes the replay command
				want := fmt.Sprintf("kafkatx offsets reset --schema %s --group %s --topic %s --partition 0 --to-offset 2 --mode replay", b.schema, b.group, b.topic)
				found := false
				for _, e := range logs.FilterMessageSnippet("behind the database watermark").All() {
					found = found || strings.Contains(fmt.Sprint(e.ContextMap()["replay_command"]), want)
				}
				if !found {
					t.Fatalf("no warning quoting %q; warnings: %v", want, logs.All())
				}
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
				t.Fatalf("%d messages re-run after Kafka's offset was %s", n, tc.name)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects"); n != 15 {
				t.Fatalf("%d effects, want 15", n)
			}
			if got := b.committedOffsets(t, 1)[0]; got != 15 {
				t.Fatalf("Kafka committed %d, want the watermark 15 re-committed", got)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = $1 AND to_offset = 10", tc.kind); n != 1 {
				t.Fatalf("no %s audit row ending at the watermark 10", tc.kind)
			}
		})
	}
}

func TestKafkaAheadIsFollowedAndAuditedAsAnUnexplainedSkip(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	produce(t, b.brokers, b.topic, values(8, 0, func(i int) string { return fmt.Sprint(i) }))
	b.setCommitted(t, 15)
	b.runUntilWatermark(t, b.handler(), b.config(t), 18)
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 10 AND "offset" < 15`); n != 0 {
		t.Fatalf("%d skipped messages were processed", n)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 15`); n != 3 {
		t.Fatalf("%d messages after the skip processed, want 3", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'unexplained_skip' AND from_offset = 10 AND to_offset = 15"); n != 1 {
		t.Fatal("no unexplained_skip audit row for [10, 15)")
	}
}

func TestKafkaAheadUnderHaltPolicyStopsWithBothOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	// A database restored from an older backup: the watermark goes back to 4.
	b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 4")
	b.exec(t, `DELETE FROM {{schema}}.effects WHERE "offset" >= 4`)
	cfg := b.config(t)
	cfg.OnKafkaAhead = AheadHalt
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	var ahead *OffsetAheadError
	if !errors.As(err, &ahead) || ahead.Watermark != 4 || ahead.Committed != 10 {
		t.Fatalf("Run returned %v, want an *OffsetAheadError naming watermark 4 and committed 10", err)
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 4`); n != 0 {
		t.Fatalf("%d messages processed under the halt policy", n)
	}
	if w := b.q(t, "SELECT next_offset FROM {{schema}}.watermarks"); w != 4 {
		t.Fatalf("watermark moved to %d under the halt policy", w)
	}
}

// deleteRecordsBefore removes partition 0's records below offset, as retention would.
func (b *testBundle) deleteRecordsBefore(t *testing.T, offset int64) {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.DeleteRecords(ctx, []kafka.TopicPartition{{Topic: &b.topic, Partition: 0, Offset: kafka.Offset(offset)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.DeleteRecordsResults {
		if r.TopicPartition.Error != nil {
			t.Fatal(r.TopicPartition.Error)
		}
	}
}

func TestRecordsRemovedBeforeProcessingAreAuditedNotCountedAsProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.deleteRecordsBefore(t, 15) // retention overtook the watermark 10
	b.runUntilWatermark(t, b.handler(), b.config(t), 20)
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 15`); n != 5 {
		t.Fatalf("%d effects at or above the log start, want 5", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'unexplained_skip' AND from_offset = 10 AND to_offset = 15"); n != 1 {
		t.Fatal("no unexplained_skip audit row for the removed records [10, 15)")
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'kafka_behind'"); n != 0 {
		t.Fatal("the retention follow was also audited as a lost Kafka commit")
	}
}

func TestWatermarkPastTheLogEndHaltsWithBothOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	// As after the topic was deleted and recreated with fewer records: the database is ahead of the log.
	b.exec(t, "UPDATE {{schema}}.watermarks SET next_offset = 100")
	c, err := NewConsumer(b.pool, b.handler(), b.config(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	var lre *LogRangeError
	if !errors.As(err, &lre) || lre.Watermark != 100 || lre.LogEnd != 10 {
		t.Fatalf("Run returned %v, want a *LogRangeError naming watermark 100 and log end 10", err)
	}
	// The same topic (its id as recorded): in the operator's words, a truncation, not a recreate.
	id := b.qs(t, "SELECT topic_id FROM {{schema}}.watermarks")
	for _, s := range []string{"[10, 100)", "no longer in it", "topic id " + id, "truncated", "unclean leader election", "--to-earliest --mode replay"} {
		if lre.TopicID != id || !strings.Contains(err.Error(), s) {
			t.Errorf("error %q (topic id %q) does not say %q", err, lre.TopicID, s)
		}
	}
}

func TestCommittedOffsetPastTheLogEndIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	b.setCommitted(t, 500)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 15)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 1"); n != 15 {
		t.Fatalf("%d effects, want 15: a committed offset past the log end was followed", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'kafka_out_of_range' AND from_offset = 500"); n != 1 {
		t.Fatal("no kafka_out_of_range audit row")
	}
}

func TestGracefulStopClearsTheInFlightMarker(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(400, 0, func(i int) string { return fmt.Sprint(i) }))
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(2 * time.Millisecond)
		return applyEffect(ctx, tx, b.schema, m)
	}
	cfg := b.config(t)
	cfg.Batch.Size = 20
	r := b.start(t, h, cfg)
	waitFor(t, 60*time.Second, "some progress", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") >= 100 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.watermarks WHERE inflight_end > next_offset"); n != 0 {
		t.Fatal("a clean stop left an in-flight marker: the next start would count a crash")
	}
}
