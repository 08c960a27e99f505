package testenv_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestSmokeKafkaToPostgres runs the loop kafkatx is built around, by hand, against the real
// broker and PostgreSQL: 1,000 records produced by an idempotent producer to a fresh
// 3-partition topic, consumed in a group with manual commits, written 100 per database
// transaction, the offsets committed after each database commit.
func TestSmokeKafkaToPostgres(t *testing.T) {
	t.Parallel()
	const n, batchSize, partitions = 1000, 100, 3
	brokers := testenv.Brokers(t)
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	topic := testenv.Topic(t, brokers, partitions)
	group := testenv.Group(t)
	table := pgx.Identifier{schema, "records"}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
		topic text NOT NULL, partition int NOT NULL, "offset" bigint NOT NULL, key bytea, value bytea,
		PRIMARY KEY (topic, partition, "offset"))`); err != nil {
		t.Fatal(err)
	}

	// Produce.
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": brokers, "enable.idempotence": true, "acks": "all", "linger.ms": 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan kafka.Event, n)
	for i := range n {
		err := p.Produce(&kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key:            fmt.Appendf(nil, "key-%d", i),
			Value:          fmt.Appendf(nil, `{"n":%d}`, i),
		}, deliveries)
		if err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	for range n {
		select {
		case e := <-deliveries:
			if m := e.(*kafka.Message); m.TopicPartition.Error != nil {
				t.Fatalf("delivery: %v", m.TopicPartition.Error)
			}
		case <-ctx.Done():
			t.Fatal("deliveries did not arrive in time")
		}
	}
	p.Close()

	// Consume in a group: 100 records per transaction, offsets committed after the DB commit.
	c, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers": brokers, "group.id": group,
		"enable.auto.commit": false, "auto.offset.reset": "earliest",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	var batch []*kafka.Message
	flush := func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		rows := make([][]any, len(batch))
		next := map[int32]kafka.Offset{}
		for i, m := range batch {
			rows[i] = []any{*m.TopicPartition.Topic, m.TopicPartition.Partition, int64(m.TopicPartition.Offset), m.Key, m.Value}
			if o := m.TopicPartition.Offset + 1; o > next[m.TopicPartition.Partition] {
				next[m.TopicPartition.Partition] = o
			}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{schema, "records"},
			[]string{"topic", "partition", "offset", "key", "value"}, pgx.CopyFromRows(rows)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		offsets := make([]kafka.TopicPartition, 0, len(next))
		for part, off := range next {
			offsets = append(offsets, kafka.TopicPartition{Topic: &topic, Partition: part, Offset: off})
		}
		if _, err := c.CommitOffsets(offsets); err != nil {
			t.Fatalf("commit offsets: %v", err)
		}
		batch = batch[:0]
	}
	for consumed := 0; consumed < n; {
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the deadline", consumed, n)
		}
		m, err := c.ReadMessage(200 * time.Millisecond)
		if err != nil {
			if kerr, ok := err.(kafka.Error); ok && kerr.IsTimeout() {
				continue
			}
			t.Fatalf("consume: %v", err)
		}
		batch = append(batch, m)
		consumed++
		if len(batch) == batchSize {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n {
		t.Errorf("table has %d rows, want %d", rows, n)
	}

	// The group's committed offsets, read back from the broker.
	tps := make([]kafka.TopicPartition, partitions)
	for i := range tps {
		tps[i] = kafka.TopicPartition{Topic: &topic, Partition: int32(i)}
	}
	committed, err := c.Committed(tps, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, tp := range committed {
		if tp.Offset < 0 {
			t.Errorf("partition %d has no committed offset (%v)", tp.Partition, tp.Offset)
			continue
		}
		sum += int64(tp.Offset)
	}
	if sum != n {
		t.Errorf("committed offsets sum to %d, want %d", sum, n)
	}
	c.Close()

	// Kafka's own kafka-consumer-groups command sees the same offsets (the group is empty now).
	t.Run("ConsumerGroupsTool", func(t *testing.T) {
		tool := testenv.ConsumerGroupsTool(t)
		out, err := exec.CommandContext(ctx, tool, "--bootstrap-server", brokers, "--describe", "--group", group).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		var sum int64
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			// GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
			if len(f) >= 6 && f[1] == topic {
				off, err := strconv.ParseInt(f[3], 10, 64)
				if err != nil {
					t.Fatalf("unexpected line %q", sc.Text())
				}
				sum += off
			}
		}
		if sum != n {
			t.Errorf("kafka-consumer-groups --describe: offsets sum to %d, want %d; output:\n%s", sum, n, out)
		}
	})
}
