package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Another consumer — one reading another Kafka cluster behind the same group and topic name,
// which Kafka's group does not show to this one — adopts its own log while this consumer
// runs: the watermark row now counts that log (AdoptLog, as Config.OnLogChange does it). This
// consumer must stop with a *LogChangedError (MovedAway) and apply nothing of its own log
// under the other log's offsets: not by seeking its log to the row's offset after a fence
// (the row moved to another offset: before the fix it ran offsets 3.. of its own log again),
// nor through a compare-and-set that succeeds because the offsets happen to match (the row
// adopted at this consumer's own offset: before the fix it applied 10.. and advanced the
// other log's watermark). The running log check does not see this (it compares the log
// recorded at the assignment with the broker's, both this consumer's): without the fix the
// consumer never stops.
func TestWatermarkAdoptedByAnotherClustersConsumerStopsThisOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		at    int64 // the other log's start, where the adoption puts the watermark
		lanes int   // Config.Concurrency
	}{{"at another offset", 3, 1}, {"at this consumer's own offset", 10, 1}, {"at another offset, 4 lanes", 3, 4}, {"at this consumer's own offset, 4 lanes", 10, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			produce(t, b.brokers, b.topic, values(10, 0, func(i int) string { return fmt.Sprint("mine-", i) }))
			cfg := b.config(t)
			cfg.Concurrency = tc.lanes
			c, err := NewConsumer(b.pool, b.handler(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			waitFor(t, 60*time.Second, "watermark 10", func() bool { return b.q(t, "SELECT coalesce(max(next_offset), 0) FROM {{schema}}.watermarks") == 10 })

			// The other cluster's consumer adopts its log, in its own transaction.
			const otherTopic, otherCluster = "other-clusters-topic-id", "other-cluster-id"
			store := offsetstore.New(b.schema)
			tp := offsetstore.TP{Topic: b.topic, Partition: 0}
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			id, err := store.InsertEvent(ctx, tx, offsetstore.Event{Group: b.group, Topic: b.topic, Kind: offsetstore.KindLogAdopted,
				From: 10, To: tc.at, Actor: "test: a consumer of another cluster", Reason: "log changed; adopted"})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.AdoptLog(ctx, tx, b.group, tp, 10, tc.at, otherTopic, otherCluster, id); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprint("mine-", 10+i) }))

			select {
			case err = <-done:
			case <-time.After(45 * time.Second):
				t.Fatalf("Run still running 45 s after another consumer adopted the watermark; applied %d records at offsets >= 10, %d applied twice",
					b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 10`), b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied > 1"))
			}
			var lce *LogChangedError
			if !errors.As(err, &lce) || !lce.MovedAway || lce.RecordedTopicID != otherTopic || lce.TopicID == "" || lce.TopicID == otherTopic {
				t.Fatalf("Run returned %v, want a *LogChangedError with MovedAway naming %s", err, otherTopic)
			}
			if n := b.q(t, `SELECT count(*) FROM {{schema}}.effects WHERE "offset" >= 10`); n != 0 {
				t.Fatalf("%d records of this consumer's log at offsets >= 10 applied under the other log's watermark", n)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied > 1"); n != 0 {
				t.Fatalf("%d records of this consumer's log applied twice", n)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.watermarks WHERE next_offset = $1 AND topic_id = $2 AND cluster_id = $3", tc.at, otherTopic, otherCluster); n != 1 {
				t.Fatalf("the other log's watermark was moved by this consumer (want it at %d, topic id %s)", tc.at, otherTopic)
			}
			if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt' AND reason LIKE '%moved onto another log%'"); n != 1 {
				t.Fatalf("%d halt audit rows naming the move, want 1", n)
			}
		})
	}
}
