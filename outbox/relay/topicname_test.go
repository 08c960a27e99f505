package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A row written with plain SQL may name any topic text. A name over 512 bytes made
// confluent-kafka-go panic in its topic lookup (the relay's metadata request, then its
// produce): every relay crashed on every restart, nothing else was published and no command
// saw the row. Such rows, and rows of any name Kafka refuses, are parked at once with the
// reason, while the valid rows of the same round are published, once.
func TestInvalidTopicNameParksWhileOthersFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	ctx := context.Background()
	cfg := b.config(t)
	cfg.UnknownTopicTimeout = time.Hour        // a park here is the name's, not a missing topic's
	long := "atk-" + strings.Repeat("x", 509)  // 513 bytes: librdkafka refuses it
	at249 := "atk-" + strings.Repeat("y", 246) // 250 characters: Kafka refuses it
	odd := "atk with space/and§unicode"        // characters Kafka refuses
	var ids []int64
	for _, tp := range []string{topic, long, at249, odd, topic} {
		var id int64
		if err := b.pool.QueryRow(ctx, `INSERT INTO `+b.t.Outbox+` (topic, key, value) VALUES ($1, 'k', 'v') RETURNING id`, tp).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	r, _ := b.start(t, cfg)
	waitFor(t, 60*time.Second, "the valid rows published and the others parked", func() bool {
		st := b.states(t)
		return st[ids[0]] == "published" && st[ids[4]] == "published" &&
			st[ids[1]] == "parked" && st[ids[2]] == "parked" && st[ids[3]] == "parked"
	})
	parked, err := b.w.Parked(ctx, b.pool, 10)
	if err != nil || len(parked) != 3 {
		t.Fatalf("Parked() = %+v, %v; want the 3 rows of invalid topics", parked, err)
	}
	want := map[string]string{
		long:  "not a valid Kafka topic name: longer than 249 characters (513)",
		at249: "not a valid Kafka topic name: longer than 249 characters (250)",
		odd:   "not a valid Kafka topic name: Kafka topic names hold only ASCII letters",
	}
	for _, p := range parked {
		if w, ok := want[p.Topic]; !ok || !strings.Contains(p.LastError, w) {
			t.Errorf("parked row %d (topic of %d bytes): last error %q, want it to say %q", p.ID, len(p.Topic), p.LastError, w)
		}
	}
	if n := len(readAll(t, b.brokers, topic)); n != 2 {
		t.Fatalf("the valid topic holds %d records, want 2 (each valid row once)", n)
	}
	if s := r.Stats(); s.Parked != 3 {
		t.Fatalf("Stats().Parked = %d, want 3", s.Parked)
	}
}
