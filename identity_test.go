package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// runUntilHalt runs a consumer with cfg and returns Run's error, which must come within 60 s.
func (b *testBundle) runUntilHalt(t *testing.T, cfg *Config) error {
	t.Helper()
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not halt within 60 s (returned %v)", err)
	}
	return err
}

// Issue "Kafka's side of the history": a topic drained, deleted, created again under the same
// name and refilled with more records than the watermark. Before, the consumer started at the
// old watermark on the new topic (Kafka had dropped the deleted topic's committed offsets:
// kafka_missing, database leads) and skipped its first records for good, silently.
func TestTopicRecreatedUnderTheSameNameRefusesToStart(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	oldID := b.qs(t, "SELECT coalesce(topic_id, '') FROM {{schema}}.watermarks")
	cluster := b.qs(t, "SELECT coalesce(cluster_id, '') FROM {{schema}}.watermarks")
	if oldID == "" || cluster == "" {
		t.Fatalf("watermark recorded topic id %q and cluster id %q; want both", oldID, cluster)
	}
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(15, 0, func(i int) string { return fmt.Sprint("new-", i) }))

	err := b.runUntilHalt(t, b.config(t))
	var lce *LogChangedError
	if !errors.As(err, &lce) {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
	if lce.RecordedTopicID != oldID || lce.TopicID == "" || lce.TopicID == oldID || lce.ClusterID != cluster || lce.Watermark != 10 {
		t.Fatalf("LogChangedError %+v: want the old topic id %s, a new one, the same cluster %s, watermark 10", lce, oldID, cluster)
	}
	for _, s := range []string{oldID, lce.TopicID, "recreated", "kafkatx offsets reset", "--mode adopt", "nothing"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"); n != 10 {
		t.Fatalf("%d applications, want the old topic's 10: something of the new topic was applied", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt' AND reason LIKE '%'||$1||'%'", lce.TopicID); n != 1 {
		t.Fatalf("%d halt audit rows naming the new topic id, want 1", n)
	}
	if w := b.q(t, "SELECT next_offset FROM {{schema}}.watermarks"); w != 10 {
		t.Fatalf("watermark moved to %d", w)
	}

	// Config.OnLogChange adopts the new log from its start: every new record applied once, on record.
	cfg := b.config(t)
	cfg.OnLogChange = LogChangeAdoptEarliest
	b.runUntilWatermark(t, b.handler(), cfg, 15)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied = 2"); n != 10 {
		t.Fatalf("%d of the new topic's first 10 offsets applied again, want 10", n)
	}
	if n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"); n != 25 {
		t.Fatalf("%d applications, want 10 old + 15 new", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'log_adopted' AND from_offset = 10 AND to_offset = 0 AND reason LIKE '%'||$1||'%' AND reason LIKE '%'||$2||'%'", oldID, lce.TopicID); n != 1 {
		t.Fatal("no log_adopted audit row [10, 0) naming both topic ids")
	}
	if id := b.qs(t, "SELECT topic_id FROM {{schema}}.watermarks"); id != lce.TopicID {
		t.Fatalf("watermark records topic id %s after the adoption, want %s", id, lce.TopicID)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'unexplained_move'"); n != 0 {
		t.Fatal("the adoption's move back was reported as unexplained by the watermarks trigger")
	}
}

// The same group and topic name pointed at another cluster (a disaster-recovery switch) whose
// topic holds other records: refused, naming both cluster ids, nothing applied.
func TestAnotherClusterRefusesToStart(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	second := testenv.SecondBrokers(t)
	testenv.NamedTopic(t, second, b.topic, 1, nil)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	cluster := b.qs(t, "SELECT coalesce(cluster_id, '') FROM {{schema}}.watermarks")
	produce(t, second, b.topic, values(15, 0, func(i int) string { return fmt.Sprint("dr-", i) }))

	cfg := b.config(t)
	cfg.Kafka["bootstrap.servers"] = second
	err := b.runUntilHalt(t, cfg)
	var lce *LogChangedError
	if !errors.As(err, &lce) || lce.RecordedClusterID != cluster || lce.ClusterID == "" || lce.ClusterID == cluster {
		t.Fatalf("Run returned %v, want a *LogChangedError naming the cluster ids %s and another", err, cluster)
	}
	for _, s := range []string{cluster, lce.ClusterID, "another Kafka cluster"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"); n != 10 {
		t.Fatalf("%d applications, want 10: something of the other cluster was applied", n)
	}
}

// A watermark row older than the ids (migration 009) is filled on first contact, not refused.
func TestWatermarkWithoutIdsIsFilledOnFirstContact(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 5)
	b.exec(t, "UPDATE {{schema}}.watermarks SET topic_id = NULL, cluster_id = NULL")
	// A dead letter of unknown log (written before the watermark had ids) is placed with it.
	b.exec(t, `INSERT INTO {{schema}}.dead_letters (group_id, topic, partition, "offset", error_class, error_message, attempts, first_failure_at, last_failure_at)
		VALUES ($1, $2, 0, 3, 'permanent', 'x', 1, now(), now())`, b.group, b.topic)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint(i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 10)
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.watermarks WHERE topic_id IS NOT NULL AND cluster_id IS NOT NULL"); n != 1 {
		t.Fatal("the ids were not filled on first contact")
	}
	if n := b.q(t, `SELECT count(*) FROM {{schema}}.dead_letters d JOIN {{schema}}.watermarks w USING (group_id, topic, partition)
		WHERE d.topic_id = w.topic_id AND d.cluster_id = w.cluster_id`); n != 1 {
		t.Fatal("the dead letter of unknown log was not placed in the watermark's log on first contact")
	}
}

// A partition count raised: the new partition starts where Config says (auto.offset.reset,
// earliest by default: nothing written to it before the consumer saw it is lost) and its
// first_run row says it was added.
func TestPartitionAddedStartsWhereConfigSaysAndIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	produce(t, b.brokers, b.topic, append(values(5, 0, func(i int) string { return fmt.Sprint(i) }), values(5, 1, func(i int) string { return fmt.Sprint(i) })...))
	b.runUntilWatermark(t, b.handler(), b.config(t), 5)
	testenv.AddPartitions(t, b.brokers, b.topic, 3)
	produce(t, b.brokers, b.topic, values(7, 2, func(i int) string { return fmt.Sprint(i) }))
	r := b.start(t, b.handler(), b.config(t))
	waitFor(t, 60*time.Second, "the added partition processed", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE partition = 2") == 7
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'first_run' AND partition = 2 AND from_offset = 0 AND reason LIKE '%partition count was raised%'"); n != 1 {
		t.Fatal("no first_run row for the added partition saying it was added")
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'first_run' AND partition < 2 AND reason LIKE '%raised%'"); n != 0 {
		t.Fatal("the first partitions' first runs were reported as added partitions")
	}
}

func (b *testBundle) qs(t *testing.T, sql string) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(context.Background(), strings.ReplaceAll(sql, "{{schema}}", pgx.Identifier{b.schema}.Sanitize())).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// The topic deleted and created again while the consumer runs, the new log shorter than the
// watermark: no rebalance happens; librdkafka's fetch at the watermark is out of range and it
// restarts at the log start on its own. Before, the records below the watermark were dropped
// as redeliveries and the rest applied; now the first of them stops the consumer with a
// *LogChangedError before anything of the new log is applied.
func TestTopicRecreatedWhileRunningRefusesTheNewLog(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	cfg := b.config(t)
	cfg.Kafka["topic.metadata.refresh.interval.ms"] = 1000
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 60*time.Second, "watermark 10", func() bool { return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 10 })
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint("new-", i) }))
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("Run still running 90 s after the topic was recreated; %d applications (want 10)", b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"))
	}
	var lce *LogChangedError
	if !errors.As(err, &lce) || lce.TopicID == lce.RecordedTopicID {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
	if n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"); n != 10 {
		t.Fatalf("%d applications, want the old topic's 10: records of the new topic were applied", n)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt' AND reason LIKE '%'||$1||'%'", lce.TopicID); n != 1 {
		t.Fatalf("%d halt audit rows naming the new topic id, want 1", n)
	}
}

// The recreated topic already holds the watermark's offsets when the client reaches it (its
// fetch waits out a long error backoff meanwhile), so librdkafka goes on at the watermark in
// the new log without going back: the running check (every 5 s) stops the consumer with a
// *LogChangedError — or a rebalance's assignment does, when the client dropped the partition
// meanwhile (a loaded machine). What it applies of the new log in the running check's window
// is bounded, not zero (0 here: the check comes before the fetch's backoff ends); the next
// start refuses (TestTopicRecreatedUnderTheSameNameRefusesToStart).
func TestTopicRecreatedWhileRunningIsFoundByTheRunningCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	cfg := b.config(t)
	cfg.Kafka["fetch.error.backoff.ms"] = 8000
	cfg.Kafka["topic.metadata.refresh.interval.ms"] = 1000
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 60*time.Second, "watermark 10", func() bool { return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 10 })
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(15, 0, func(i int) string { return fmt.Sprint("new-", i) }))
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("Run still running 5 minutes after the topic was recreated; %d applications", b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"))
	}
	var lce *LogChangedError
	if !errors.As(err, &lce) || lce.TopicID == lce.RecordedTopicID {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
	n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects")
	t.Logf("applied of the new log before the consumer stopped: %d", n-10)
	if b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt' AND reason LIKE 'log changed%'") != 1 {
		t.Fatal("no halt audit row of the changed log")
	}
}

// The running check's window, told as it is: the client follows a recreated topic at the
// watermark (a short fetch backoff, the new log filled past it at once), so records of the new
// log may be applied before the check (every 5 s) sees the new topic id. The consumer's report
// — the *LogChangedError, the halt audit row — must then name the range [AppliedFrom,
// Watermark) those records lie in, and never say that nothing was applied (found by a fresh
// user's attack: "halting: nothing applied from the new log" after 6,890 of its records).
func TestTopicRecreatedWhileRunningNamesWhatTheWindowApplied(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	cfg := b.config(t)
	cfg.Kafka["fetch.error.backoff.ms"] = 100
	cfg.Kafka["topic.metadata.refresh.interval.ms"] = 1000
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hang's ceiling
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 60*time.Second, "watermark 10", func() bool { return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 10 })
	// A running check sees the old log at watermark 10 (a loaded machine may miss it: the
	// range reported then starts lower, which the checks below accept).
	time.Sleep(6 * time.Second)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(400, 0, func(i int) string { return fmt.Sprint("new-", i) }))
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("Run still running 5 minutes after the topic was recreated; %d applications", b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"))
	}
	var lce *LogChangedError
	if !errors.As(err, &lce) || lce.TopicID == lce.RecordedTopicID {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
	// The new log's records applied are those at offsets 10 and up (the old log ended at 10).
	newApplied := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 10`)
	t.Logf("applied of the new log before the consumer stopped: %d (range reported [%d, %d), running %v)", newApplied, lce.AppliedFrom, lce.Watermark, lce.Running)
	if newApplied > 0 {
		lo, hi := b.q(t, `SELECT min("offset") FROM {{schema}}.effects WHERE "offset" >= 10`), b.q(t, `SELECT max("offset") FROM {{schema}}.effects WHERE "offset" >= 10`)
		if !lce.Running || lce.AppliedFrom > lo || hi >= lce.Watermark {
			t.Fatalf("records [%d, %d] of the new log were applied, but the error reports running=%v and range [%d, %d): %v", lo, hi, lce.Running, lce.AppliedFrom, lce.Watermark, err)
		}
		if strings.Contains(err.Error(), "processed nothing") {
			t.Fatalf("the error says nothing was processed after %d records of the new log were applied: %v", newApplied, err)
		}
		if n := b.q(t, fmt.Sprintf(`SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt' AND from_offset = %d AND to_offset = %d AND reason LIKE '%%may be the new log''s%%'`, lce.AppliedFrom, lce.Watermark)); n != 1 {
			t.Fatalf("no halt audit row naming the range [%d, %d)", lce.AppliedFrom, lce.Watermark)
		}
	} else if lce.Running && lce.AppliedFrom < lce.Watermark && lce.AppliedFrom >= 10 {
		t.Fatalf("nothing of the new log applied, but the error reports [%d, %d)", lce.AppliedFrom, lce.Watermark)
	}
}

// A topic recreated while the consumer runs, when the old log's leader epoch had gone up (the
// broker restarted: epoch 0 → 2 here) and the new log starts at 0: librdkafka itself refuses
// to follow the new log ("ignoring outdated metadata update with leader epoch 0 which is
// older than our cached epoch 2", KIP-320 fencing) and stops fetching the partition, so no
// record of the new log reaches the loop — the case a per-record leader-epoch check would
// prove is the one where no record comes (docs/offsets.md). The running check stops the
// consumer with a *LogChangedError; nothing of the new log is applied. Kills the broker:
// runs under `make test-outages`.
func TestTopicRecreatedWhileRunningAtAHigherLeaderEpochIsNotFollowed(t *testing.T) {
	testenv.NeedBrokerKills(t)
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	testenv.KillBroker(t, b.brokers, time.Second) // a new leader epoch for the old log
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint("old-after-restart-", i) }))
	cfg := b.config(t)
	cfg.Kafka["topic.metadata.refresh.interval.ms"] = 1000
	cfg.Kafka["fetch.error.backoff.ms"] = 100
	c, err := NewConsumer(b.pool, b.handler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 60*time.Second, "watermark 15", func() bool { return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 15 })
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(40, 0, func(i int) string { return fmt.Sprint("new-", i) }))
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("Run still running 60 s after the topic was recreated; %d applications (want 15)", b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"))
	}
	if n := b.q(t, "SELECT sum(applied) FROM {{schema}}.effects"); n != 15 {
		t.Fatalf("%d applications, want the old log's 15: records of the new log were applied (Run returned %v)", n, err)
	}
	var lce *LogChangedError
	if !errors.As(err, &lce) || lce.TopicID == lce.RecordedTopicID {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
}
