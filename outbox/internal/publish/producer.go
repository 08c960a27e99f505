package publish

import (
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/kafkaprops"
)

// Partitioner is both relays' default librdkafka partitioner: murmur2 for keyed records, as
// the Java client's default partitioner (so a key lands on the same partition whichever
// client wrote it), random for nil keys.
const Partitioner = "murmur2_random"

// ProducerDefaults sets, in kc, each of both relays' producer defaults that kc does not
// give: partitioner=murmur2_random (Partitioner), linger.ms=5 (batches fill within 5 ms
// without delaying a lone record much), topic.metadata.propagation.max.ms=2000
// (TopicPropagationWait), and go.delivery.report.fields=none (a delivery report needs only
// the error and the Opaque, not a copy of each record's key and value), and the producer's Go
// channels small (kafkaprops.SmallGoChannels). What a relay forces (acks=all,
// enable.idempotence, transactional.id in WAL mode) it sets itself.
func ProducerDefaults(kc kafka.ConfigMap) {
	for k, v := range map[string]kafka.ConfigValue{"partitioner": Partitioner, "linger.ms": 5, "go.delivery.report.fields": "none",
		"topic.metadata.propagation.max.ms": TopicPropagationWait} {
		if _, ok := kc[k]; !ok {
			kc[k] = v
		}
	}
	kafkaprops.SmallGoChannels(kc)
}

// TopicPropagationWait (ms) is the relays' topic.metadata.propagation.max.ms (librdkafka's
// default is 30,000): how long librdkafka holds the records of a topic its metadata does not
// show before it fails them. Both relays ask the broker whether a topic exists before they
// produce to it (a metadata request that also fills librdkafka's cache), so the wait only
// delays the records of a topic deleted while a relay knew it — and with them everything the
// relay has in flight: the table relay's round waits for all of its delivery reports, the WAL
// relay's Kafka transaction for its commit. 30 s for each such round (a fresh-eyes attack)
// against 2 s.
const TopicPropagationWait = 2000

// CloseWait is how long a relay waits for its producer to close (CloseBounded).
const CloseWait = 5 * time.Second

// CloseBounded closes p and waits at most CloseWait for it: librdkafka's close waits for its
// broker threads, and with a broker frozen or cut off mid-request it did not return until the
// broker answered again — a SIGTERMed relay or service stayed up for as long as the outage (a
// second fresh-eyes attack: 40–60 s and more). A close that takes longer is left to finish in
// the background (or to the process's exit), logged on log, and CloseBounded returns false;
// what the producer had not delivered stays unmarked and is published again, as after a crash.
func CloseBounded(p *kafka.Producer, log *zap.Logger) bool {
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(CloseWait):
		log.Warn("the Kafka producer did not close within publish.CloseWait; left to finish in the background (a broker that does not answer)",
			zap.Duration("waited", CloseWait))
		return false
	}
}
