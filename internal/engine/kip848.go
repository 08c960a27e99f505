package engine

import (
	"bytes"
	"encoding/binary"
	"reflect"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
)

// What the KIP-848 consumer group protocol (group.protocol=consumer) needs beyond the classic
// one. Config.WithDefaults adapts and checks the configuration (consumerProtocolRefused).

// checkJoined marks a consumer-protocol member joined once the group coordinator gave it a
// member id and epoch, even with an empty assignment. Under that protocol librdkafka (2.11)
// calls the rebalance callback only when partitions are added or removed, so a member the
// broker gives no partition (more members than partitions) would never be ready otherwise.
// Run calls it once a second while the member is not joined.
func (l *Loop) checkJoined() {
	if !l.set.ConsumerProtocol {
		return
	}
	l.health.mu.Lock()
	joined := l.health.joined
	l.health.mu.Unlock()
	if joined {
		return
	}
	md, err := l.kc.GetConsumerGroupMetadata()
	if err != nil {
		return
	}
	member, epoch, ok := memberOf(md, l.group)
	if !ok || member == "" || epoch <= 0 {
		return
	}
	l.joined()
	l.log.Info("joined the group", zap.Int32("member_epoch", epoch), zap.Int("assigned_partitions", l.assignedCount()))
}

// memberOf reads the member id and epoch (generation) out of librdkafka's consumer group
// metadata, which confluent-kafka-go keeps only in librdkafka's serialized form
// (rd_kafka_consumer_group_metadata_write: "CGMDv2:", the generation as a native int32, then
// the group id and the member id, each NUL-terminated). ok is false when the form is not that
// one (another librdkafka), so the caller changes nothing.
func memberOf(md *kafka.ConsumerGroupMetadata, group string) (member string, epoch int32, ok bool) {
	if md == nil {
		return "", 0, false
	}
	f := reflect.ValueOf(md).Elem().FieldByName("serialized")
	if !f.IsValid() || f.Kind() != reflect.Slice || f.Type().Elem().Kind() != reflect.Uint8 {
		return "", 0, false
	}
	return parseGroupMetadata(f.Bytes(), group)
}

func parseGroupMetadata(b []byte, group string) (member string, epoch int32, ok bool) {
	const magic = "CGMDv2:"
	if !bytes.HasPrefix(b, []byte(magic)) || len(b) < len(magic)+4 {
		return "", 0, false
	}
	epoch = int32(binary.NativeEndian.Uint32(b[len(magic):]))
	fields := bytes.SplitN(b[len(magic)+4:], []byte{0}, 3)
	if len(fields) < 3 || string(fields[0]) != group {
		return "", 0, false
	}
	return string(fields[1]), epoch, true
}
