package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Produce writes msgs to partition 0 of topic, in order, with an idempotent producer, and
// fails t unless the broker acknowledged every one. Each message's TopicPartition is set
// here; keys, values and headers are sent as given.
func Produce(t testing.TB, brokers, topic string, msgs []kafka.Message) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "enable.idempotence": true, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, len(msgs))
	for i := range msgs {
		m := msgs[i]
		m.TopicPartition = kafka.TopicPartition{Topic: &topic, Partition: 0}
		if err := p.Produce(&m, ch); err != nil {
			t.Fatal(err)
		}
	}
	for range msgs {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
}

// Read reads n records of topic from its start, in a consumer group of its own, and fails t
// when fewer than n arrive within 60 s.
func Read(t testing.TB, brokers, topic string, n int) []*kafka.Message {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": "reader-" + topic,
		"auto.offset.reset": "earliest", "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	var out []*kafka.Message
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(out) < n && ctx.Err() == nil {
		if m, err := c.ReadMessage(time.Second); err == nil {
			out = append(out, m)
		}
	}
	if len(out) < n {
		t.Fatalf("%d of %d records on %s", len(out), n, topic)
	}
	return out
}
