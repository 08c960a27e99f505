package relay

import (
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/kafkaprops"
)

// The producer's Go channels are sized for what the relay uses: confluent-kafka-go's
// 1,000,000-slot defaults are 23 MiB of heap the garbage collector scans in every cycle of
// the process the relay runs in. A size the caller gives is kept.
func TestProducerChannelsSizedForTheRelay(t *testing.T) {
	c, err := (&Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1"}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Kafka["go.events.channel.size"]; got != kafkaprops.GoEventsChannelSize {
		t.Errorf("go.events.channel.size = %v, want %d", got, kafkaprops.GoEventsChannelSize)
	}
	if got := c.Kafka["go.produce.channel.size"]; got != 1 {
		t.Errorf("go.produce.channel.size = %v, want 1", got)
	}
	c, err = (&Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "go.events.channel.size": 50000}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Kafka["go.events.channel.size"]; got != 50000 {
		t.Errorf("go.events.channel.size given 50000 became %v", got)
	}
}
