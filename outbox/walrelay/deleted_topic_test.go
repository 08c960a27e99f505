package walrelay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A topic deleted while the WAL relay streams: its record is parked ("does not exist"), and
// the record committed after it, for a topic that exists, is published once within a bound.
// With librdkafka's topic.metadata.propagation.max.ms of 30 s the next record waited 61.8 s
// (the transaction's commit failed after 30 s, and the stream that found the record with
// delivery reports waited 30 s more); with the relays' 2 s (publish.TopicPropagationWait),
// 2.7 s.
func TestATopicDeletedUnderTheWALRelayIsParkedAndTheRestFlow(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	ctx := context.Background()
	gone := testenv.Topic(t, b.brokers, 1)
	r, _, _ := b.start(t, b.config(t))
	write := func(recs ...outbox.Record) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
			t.Fatal(err)
		}
	}
	write(outbox.Record{Topic: gone, Key: []byte("k"), Value: []byte("while it exists")})
	testenv.WaitFor(t, 60*time.Second, "the first record published", func() bool { return r.Stats().Published >= 1 })
	testenv.DeleteTopic(t, b.brokers, gone)
	time.Sleep(time.Second)
	start := time.Now()
	write(outbox.Record{Topic: gone, Key: []byte("k"), Value: []byte("after the delete")},
		outbox.Record{Topic: b.topic, Key: []byte("k"), Value: []byte("elsewhere")})
	got := readAll(t, b.brokers, b.topic, 1, time.Second, 90*time.Second)
	took := time.Since(start)
	if len(got) != 1 || string(got[0].Value) != "elsewhere" {
		t.Fatalf("the existing topic holds %d records; want the one, once", len(got))
	}
	if took > 20*time.Second {
		t.Errorf("the record after the deleted topic's waited %s; want well under librdkafka's 30 s", took.Round(time.Millisecond))
	}
	testenv.WaitFor(t, 60*time.Second, "the deleted topic's record parked", func() bool {
		parked, err := outbox.Writer{}.Parked(ctx, b.pool, 10)
		return err == nil && len(parked) == 1 && parked[0].Topic == gone && strings.Contains(parked[0].LastError, "does not exist")
	})
	t.Logf("the existing topic's record was published %s after the commit (readAll's 1 s quiet included)", took.Round(time.Millisecond))
}
