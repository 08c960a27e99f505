package offsets

import (
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// NewKafka reads its handle's events: with the small Go channels of every admin handle
// (kafkaprops.SmallGoChannels), an unread channel fills with the client-level errors of a
// broker outage and parks the handle's poller for good. Here the channel holds one event and
// no broker answers (refused connections, retried every few milliseconds): read, it is empty
// at some look; unread, it is full at every look once the first errors came.
func TestNewKafkaReadsItsHandlesEvents(t *testing.T) {
	k, err := NewKafka(kafka.ConfigMap{
		"bootstrap.servers":        "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", // nothing listens on these ports
		"reconnect.backoff.ms":     1,
		"reconnect.backoff.max.ms": 5,
		"go.events.channel.size":   1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	time.Sleep(3 * time.Second) // librdkafka reports the refused connections (about one a second)
	for range 20 {
		if len(k.producer.Events()) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the admin handle's events channel stayed full for 2 s: nothing reads it")
}
