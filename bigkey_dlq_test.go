package kafkatx

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// Issue 48 through the consumer loop: a message with a 3,008-byte key is dead-lettered, and
// its dead-letter record (which keeps the key) is refused by the dead-letter topic for its
// size. The relay parks it, where `kafkatx outbox parked` lists it, and publishes the next
// dead letter's record once. Before, parking it failed on the parked rows' index (SQLSTATE
// 54000) with the relay's whole mark: the record stayed pending and nothing more was marked.
func TestDeadLetterWithABigKeyParksItsRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	dlqTopic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "2000"})
	key := make([]byte, 3008)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, []testRecord{{key: key, value: []byte("big"), partition: 0}})
	cfg := b.config(t)
	cfg.DeadLetter.Topic = func(string) string { return dlqTopic }
	b.start(t, func(context.Context, pgx.Tx, *Message) error { return Permanent(errors.New("refused by the handler")) }, cfg)
	rl, err := relay.New(b.pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.brokers}, Schema: b.schema,
		Logger: zaptest.NewLogger(t), PollInterval: 200 * time.Millisecond, KeepPublished: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	w := outbox.Writer{Schema: b.schema}
	parked := func() []outbox.ParkedRow {
		p, err := w.Parked(context.Background(), b.pool, 10)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	waitForThen(t, 60*time.Second, "the big key's dead-letter record parked", func() bool { return len(parked()) == 1 },
		func() string { return "outbox states: " + b.outboxStates(t) })
	if p := parked()[0]; p.Topic != dlqTopic || len(p.Key) != len(key) {
		t.Fatalf("parked %s with a %d-byte key, want the dead-letter record with the %d-byte key", p.Topic, len(p.Key), len(key))
	}
	// The next dead letter's record is published once and marked.
	produce(t, b.brokers, b.topic, []testRecord{{key: []byte("small"), value: []byte("next"), partition: 0}})
	waitForThen(t, 60*time.Second, "the next dead-letter record published and marked", func() bool {
		return b.q(t, `SELECT count(*) FROM `+tables.For(b.schema).Outbox+` WHERE state = 'published'`) == 1
	}, func() string { return "outbox states: " + b.outboxStates(t) })
	time.Sleep(time.Second)
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "group.id": "kafkatx-test-reader"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lo, hi, err := c.QueryWatermarkOffsets(dlqTopic, 0, 10000)
	if err != nil || hi-lo != 1 {
		t.Fatalf("the dead-letter topic holds %d records (%v), want 1", hi-lo, err)
	}
}

// outboxStates is "state:count ..." of the outbox rows, for a failure's message.
func (b *testBundle) outboxStates(t *testing.T) string {
	var s string
	if err := b.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(state || ':' || n, ' '), '') FROM
		(SELECT state, count(*) n FROM `+tables.For(b.schema).Outbox+` GROUP BY state) x`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
