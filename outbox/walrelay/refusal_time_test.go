package walrelay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// Issue "outages" 5, the measurement: a record the broker refuses although the topic's limits
// read at the stream's start let it through (max.message.bytes lowered while the relay runs)
// is parked, and the record after it published once. It logs how long the refusal cost: from
// the commit of [refused, next] to next's publication, against the same for a record alone
// just before (the figures for docs/outbox-wal.md; no bound is asserted).
func TestRecordRefusedMidStreamIsParkedAndTheNextPublished(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	ctx := context.Background()
	r, _, _ := b.start(t, b.config(t))
	write := func(recs ...outbox.Record) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
			t.Fatal(err)
		}
	}
	until := func(published int64) time.Duration {
		t.Helper()
		start := time.Now()
		for r.Stats().Published < published {
			if time.Since(start) > 90*time.Second {
				t.Fatalf("published %d of %d within 90 s", r.Stats().Published, published)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return time.Since(start)
	}
	write(outbox.Record{Topic: b.topic, Key: []byte("k"), Value: []byte("warm")})
	until(1)
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	res, err := admin.IncrementalAlterConfigs(ctx, []kafka.ConfigResource{{Type: kafka.ResourceTopic, Name: b.topic,
		Config: []kafka.ConfigEntry{{Name: "max.message.bytes", Value: "2000", IncrementalOperation: kafka.AlterConfigOpTypeSet}}}})
	if err != nil || res[0].Error.Code() != kafka.ErrNoError {
		t.Fatalf("lower max.message.bytes: %v %v", err, res)
	}
	time.Sleep(2 * time.Second) // the broker applies the topic's new limit
	write(outbox.Record{Topic: b.topic, Key: []byte("k"), Value: []byte("alone")})
	base := until(2) // from the commit to the publication
	write(outbox.Record{Topic: b.topic, Key: []byte("k"), Value: []byte("big" + strings.Repeat("x", 5000))},
		outbox.Record{Topic: b.topic, Key: []byte("k"), Value: []byte("next")})
	cost := until(3)
	t.Logf("a record alone: published %s after its commit; a refused record and the next: next published %s after their commit (parked %d)",
		base.Round(time.Millisecond), cost.Round(time.Millisecond), r.Stats().Parked)
	if p := r.Stats().Parked; p != 1 {
		t.Fatalf("Stats.Parked %d, want 1 (the refused record)", p)
	}
	onceEach(t, readAll(t, b.brokers, b.topic, 3, 2*time.Second, 60*time.Second), []string{"warm", "alone", "next"})
}
