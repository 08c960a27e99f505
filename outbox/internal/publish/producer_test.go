package publish

import (
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/kafkaprops"
)

// Both relays' producers (the WAL relay's too: before, it kept confluent-kafka-go's
// 1,000,000-slot channels, 23 MiB of scanned heap) get small Go channels.
func TestProducerDefaultsKeepTheGoChannelsSmall(t *testing.T) {
	kc := kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1"}
	ProducerDefaults(kc)
	if kc["go.events.channel.size"] != kafkaprops.GoEventsChannelSize || kc["go.produce.channel.size"] != 1 {
		t.Fatalf("ProducerDefaults left %v", kc)
	}
	if kc["partitioner"] != Partitioner || kc["linger.ms"] != 5 {
		t.Fatalf("ProducerDefaults left %v", kc)
	}
}
