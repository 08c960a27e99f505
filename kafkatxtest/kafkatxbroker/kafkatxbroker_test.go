package kafkatxbroker_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/kafkatxtest/kafkatxbroker"
)

// TestConsumerGroupCommits checks what the demo and the fast tests need from the in-process
// broker with librdkafka: AdminClient topic creation, the idempotent producer, a consumer group
// with manual commits, and reading the committed offsets back in a new consumer.
func TestConsumerGroupCommits(t *testing.T) {
	b, err := kafkatxbroker.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if host, _, _ := net.SplitHostPort(b.Bootstrap()); host != "127.0.0.1" {
		t.Fatalf("broker listens on %s, want 127.0.0.1 only", b.Bootstrap())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const topic, partitions, n = "orders", 3, 300
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.Bootstrap()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}})
	admin.Close()
	if err != nil || res[0].Error.Code() != kafka.ErrNoError {
		t.Fatalf("create topic: %v %v", err, res)
	}

	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": b.Bootstrap(), "enable.idempotence": true, "acks": "all"})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan kafka.Event, n)
	for i := range n {
		tp := topic
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &tp, Partition: kafka.PartitionAny},
			Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}, deliveries)
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if m := (<-deliveries).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatalf("delivery: %v", m.TopicPartition.Error)
		}
	}
	p.Close()

	group := "g-" + strings.ReplaceAll(t.Name(), "/", "-")
	newConsumer := func() *kafka.Consumer {
		c, err := kafka.NewConsumer(&kafka.ConfigMap{
			"bootstrap.servers": b.Bootstrap(), "group.id": group,
			"enable.auto.commit": false, "auto.offset.reset": "earliest",
			"session.timeout.ms": 6000,
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := newConsumer()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < n {
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d before the deadline", got, n)
		}
		m, err := c.ReadMessage(200 * time.Millisecond)
		if err != nil {
			if err.(kafka.Error).IsTimeout() {
				continue
			}
			t.Fatal(err)
		}
		got++
		if _, err := c.CommitMessage(m); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	c.Close()

	// A fresh member of the group reads the committed offsets back.
	c2 := newConsumer()
	defer c2.Close()
	tps := make([]kafka.TopicPartition, partitions)
	for i := range tps {
		tps[i] = kafka.TopicPartition{Topic: new(topic), Partition: int32(i)}
	}
	committed, err := c2.Committed(tps, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, tp := range committed {
		if tp.Offset < 0 {
			t.Fatalf("partition %d has no committed offset", tp.Partition)
		}
		sum += int64(tp.Offset)
	}
	if sum != n {
		t.Fatalf("committed offsets sum to %d, want %d", sum, n)
	}
}
