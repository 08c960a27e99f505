package publish

import "github.com/confluentinc/confluent-kafka-go/v2/kafka"

// Partitioner is both relays' default librdkafka partitioner: murmur2 for keyed records, as
// the Java client's default partitioner (so a key lands on the same partition whichever
// client wrote it), random for nil keys.
const Partitioner = "murmur2_random"

// ProducerDefaults sets, in kc, each of both relays' producer defaults that kc does not
// give: partitioner=murmur2_random (Partitioner), linger.ms=5 (batches fill within 5 ms
// without delaying a lone record much), and go.delivery.report.fields=none (a delivery
// report needs only the error and the Opaque, not a copy of each record's key and value).
// What a relay forces (acks=all, enable.idempotence, transactional.id in WAL mode) it sets
// itself.
func ProducerDefaults(kc kafka.ConfigMap) {
	for k, v := range map[string]kafka.ConfigValue{"partitioner": Partitioner, "linger.ms": 5, "go.delivery.report.fields": "none"} {
		if _, ok := kc[k]; !ok {
			kc[k] = v
		}
	}
}
