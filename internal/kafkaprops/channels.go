package kafkaprops

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

// GoEventsChannelSize is the go.events.channel.size SmallGoChannels sets: room for the
// delivery reports and client-level events of a producer whose events a goroutine reads
// as they come.
const GoEventsChannelSize = 1000

// SmallGoChannels sets, in cfg, go.events.channel.size=1000 (GoEventsChannelSize) and
// go.produce.channel.size=1 unless cfg gives them. confluent-kafka-go allocates both channels
// of every producer handle — an admin client's included — at 1,000,000 slots by default: 23
// MiB of pointer-holding Go heap per handle that the garbage collector scans in every cycle of
// the process. kafkatx never produces through the produce channel (it calls Produce), and reads
// its handles' events as they come. In the order service (a 128 MiB memory limit) two such
// handles — the WAL relay's producer and the consumer's admin client — kept a live heap of
// 86–94 MB and the collector busy 11–14% of the time (docs/benchmarks.md).
func SmallGoChannels(cfg kafka.ConfigMap) {
	if _, ok := cfg["go.events.channel.size"]; !ok {
		cfg["go.events.channel.size"] = GoEventsChannelSize
	}
	if _, ok := cfg["go.produce.channel.size"]; !ok {
		cfg["go.produce.channel.size"] = 1
	}
}
