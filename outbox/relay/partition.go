package relay

import (
	"fmt"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// byMurmur2 reports whether the producer partitions keyed records by murmur2: librdkafka's
// partitioner murmur2 or murmur2_random (the relay's default, set in withDefaults).
func byMurmur2(cfg kafka.ConfigMap) bool {
	switch fmt.Sprint(cfg["partitioner"]) {
	case "murmur2", "murmur2_random":
		return true
	}
	return false
}

// murmur2 is the hash of the Java client's default partitioner (Kafka's
// org.apache.kafka.common.utils.Utils.murmur2, seed 0x9747b28c), which librdkafka's
// partitioner=murmur2 and murmur2_random (the relay's default) use for keyed records: the
// partition of key k over n partitions is (murmur2(k) & 0x7fffffff) % n.
// TestKeyedRecordsArePartitionedWithMurmur2 checks it against where the broker put records.
func murmur2(data []byte) uint32 {
	const m, r = 0x5bd1e995, 24
	n := len(data)
	h := uint32(0x9747b28c) ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// partitionOf returns the partition librdkafka will give w over partitions partitions, when
// it can be known before producing: the row's explicit partition, or its key's murmur2
// partition while the producer partitions by murmur2. ok is false for nil keys (a random
// partition), other partitioners, and an unknown partition count.
func partitionOf(w *row, partitions int, byMurmur2 bool) (int32, bool) {
	if w.partition != nil {
		return *w.partition, true
	}
	if w.key == nil || !byMurmur2 || partitions <= 0 {
		return 0, false
	}
	return int32((murmur2(w.key) & 0x7fffffff) % uint32(partitions)), true
}
