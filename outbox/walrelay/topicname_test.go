package walrelay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// A row inserted with plain SQL (the table's trigger emits it in WAL mode) may name any topic
// text. A name over 512 bytes made confluent-kafka-go panic in the relay's metadata request:
// the Kafka transaction was lost, the slot never advanced and every restart crashed again.
// Records of a name Kafka refuses are parked at once with the reason; the valid records of
// the same transaction, and later ones, are published once.
func TestInvalidTopicNameIsParkedAndTheRestPublishedOnce(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	ctx := context.Background()
	long := "atk-" + strings.Repeat("x", 509) // 513 bytes: librdkafka refuses it
	odd := "atk with space/and§unicode"       // characters Kafka refuses
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i, tp := range []string{b.topic, long, odd, b.topic} {
			if _, err := tx.Exec(ctx, `INSERT INTO kafkatx.outbox (topic, key, value) VALUES ($1, 'k', $2)`, tp, "v"+string(rune('0'+i))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.write(t, "after", 5, 2)
	r, _, _ := b.start(t, b.config(t))
	onceEach(t, readAll(t, b.brokers, b.topic, 7, 3*time.Second, 90*time.Second), append([]string{"v0", "v3"}, values("after", 5)...))
	parked, err := outbox.Writer{}.Parked(ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		long: "not a valid Kafka topic name: longer than 249 characters (513)",
		odd:  "not a valid Kafka topic name: Kafka topic names hold only ASCII letters",
	}
	if len(parked) != 2 {
		t.Fatalf("parked rows %+v: want the 2 records of invalid topic names", parked)
	}
	for _, p := range parked {
		if w, ok := want[p.Topic]; !ok || !strings.Contains(p.LastError, w) {
			t.Errorf("parked row %d (topic of %d bytes): last error %q, want it to say %q", p.ID, len(p.Topic), p.LastError, w)
		}
	}
	if s := r.Stats(); s.Parked != 2 {
		t.Fatalf("Stats().Parked = %d, want 2", s.Parked)
	}
}
