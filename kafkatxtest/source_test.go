package kafkatxtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// TestKitGivesTheLoopsOutboxIDs runs one handler under the loop, on a real broker, and under
// the kit, for the same input message: the records it writes through the outbox get the same
// kafkatx-outbox-ids in both (the kit stamps the loop's outbox source on its messages), for a
// per-message Handler (the source in ctx) and a BatchHandler (Message.OutboxSource).
func TestKitGivesTheLoopsOutboxIDs(t *testing.T) {
	brokers := testenv.Brokers(t)
	topic, group := testenv.Topic(t, brokers, 1), testenv.Group(t)

	// records writes two events for m to schema's outbox, with ctx's source or src.
	records := func(ctx context.Context, tx pgx.Tx, schema string, src *outbox.Source, m *kafkatx.Message) error {
		recs := []outbox.Record{
			{Topic: topic + ".events", Key: m.Key, Value: append([]byte("first "), m.Value...), Source: src},
			{Topic: topic + ".events", Key: m.Key, Value: append([]byte("second "), m.Value...), Source: src},
		}
		_, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, recs...)
		return err
	}
	handler := func(schema string) kafkatx.Handler {
		return func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
			return records(ctx, tx, schema, nil, m)
		}
	}
	batchHandler := func(schema string) kafkatx.BatchHandler {
		return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
			for _, m := range msgs {
				if err := records(context.Background(), tx, schema, m.OutboxSource(), m); err != nil {
					return err
				}
			}
			return nil
		}
	}

	// The loop, in a kit's schema.
	loopKit := kafkatxtest.New(t, nil)
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan kafka.Event, 1)
	if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0},
		Key: []byte("order-7"), Value: []byte("paid")}, deliveries); err != nil {
		t.Fatal(err)
	}
	if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
		t.Fatal(m.TopicPartition.Error)
	}
	p.Close()
	c, err := kafkatx.NewConsumer(loopKit.Pool(), handler(loopKit.Schema()), &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
		Topics: []string{topic}, Schema: loopKit.Schema(),
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var loopIDs []uuid.UUID
	var topicID string
	testenv.WaitFor(t, 60*time.Second, "the loop wrote both records", func() bool {
		rows, err := loopKit.Pool().Query(context.Background(), fmt.Sprintf(`SELECT outbox_id::text FROM %q.outbox ORDER BY id`, loopKit.Schema()))
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		loopIDs = loopIDs[:0]
		for _, id := range ids {
			loopIDs = append(loopIDs, uuid.MustParse(id))
		}
		return len(loopIDs) == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := loopKit.Pool().QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(topic_id, '') FROM %q.watermarks WHERE group_id = $1 AND topic = $2`, loopKit.Schema()),
		group, topic).Scan(&topicID); err != nil {
		t.Fatal(err)
	}
	if loopIDs[0].Version() != 5 || loopIDs[0] == loopIDs[1] {
		t.Fatalf("the loop's outbox ids %v are not derived from the message (version 5, one per record)", loopIDs)
	}

	// The kit, in a schema of its own, with the loop's group and the log's topic id.
	k := kafkatxtest.New(t, &kafkatxtest.Options{Group: group, TopicIDs: map[string]string{topic: topicID}})
	msg := func() *kafkatx.Message { return kafkatxtest.NewMessage(topic, 0, 0, []byte("order-7"), []byte("paid")) }
	for name, run := range map[string]func() *kafkatxtest.Tx{
		"Handler":      func() *kafkatxtest.Tx { return k.Run(handler(k.Schema()), msg()) },
		"BatchHandler": func() *kafkatxtest.Tx { return k.RunBatch(batchHandler(k.Schema()), msg()) },
	} {
		tx := run()
		if o := tx.Outcome(0); o.Kind != kafkatxtest.Committed {
			t.Fatalf("%s: %v", name, o)
		}
		recs := tx.Outbox()
		if len(recs) != 2 {
			t.Fatalf("%s: the kit wrote %d records, want 2", name, len(recs))
		}
		for i, r := range recs {
			if r.OutboxID != loopIDs[i] {
				t.Errorf("%s: record %d's outbox id under the kit is %s, under the loop %s", name, i, r.OutboxID, loopIDs[i])
			}
		}
		if err := tx.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
