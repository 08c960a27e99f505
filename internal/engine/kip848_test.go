package engine

import (
	"encoding/binary"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// TestCommitterRequeuesCommitsRefusedForAStaleOrFencedMember needs no broker: under
// group.protocol=consumer a commit sent with a member epoch the coordinator has moved past is
// refused with STALE_MEMBER_EPOCH (113), and one from a member it removed with
// UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH (librdkafka #5541, node-rdkafka #1146). None of
// them is fatal: the commit stays pending and is committed by the next round; no database
// transaction runs again (the committer only talks to Kafka).
func TestCommitterRequeuesCommitsRefusedForAStaleOrFencedMember(t *testing.T) {
	for _, code := range []kafka.ErrorCode{kafka.ErrStaleMemberEpoch, kafka.ErrUnknownMemberID, kafka.ErrFencedMemberEpoch} {
		for _, whole := range []bool{true, false} {
			c := newCommitter(nil, zap.NewNop())
			a := offsetstore.TP{Topic: "t", Partition: 0}
			refuse := true
			var committed int64 = -1
			c.commitFn = func(tps []kafka.TopicPartition) ([]kafka.TopicPartition, error) {
				if refuse {
					e := kafka.NewError(code, code.String(), false)
					if whole {
						return nil, e
					}
					out := append([]kafka.TopicPartition(nil), tps...)
					out[0].Error = e
					return out, nil
				}
				committed = int64(tps[0].Offset)
				return tps, nil
			}
			c.enqueue(a, 42)
			err := c.commit(c.take(nil))
			if ke, ok := err.(kafka.Error); !ok || ke.Code() != code || ke.IsFatal() {
				t.Fatalf("%s (whole call %v): commit returned %v; want the non-fatal refusal", code, whole, err)
			}
			refuse = false
			if err := c.commit(c.take(nil)); err != nil || committed != 42 {
				t.Fatalf("%s (whole call %v): the retry committed %d (%v); want 42", code, whole, committed, err)
			}
		}
	}
}

// memberOf reads librdkafka's serialized group metadata (a member with an empty assignment is
// known to have joined only from it): the form seen from librdkafka 2.11.1 for a member with
// epoch 2, and confluent-kafka-go's own test metadata through the reflection path.
func TestMemberOfReadsLibrdkafkasGroupMetadata(t *testing.T) {
	b := []byte("CGMDv2:\x00\x00\x00\x00g-1\x00yRvya2xuRRCNG+Aw7yMCLQ\x00\x01")
	binary.NativeEndian.PutUint32(b[7:], 2)
	if m, e, ok := parseGroupMetadata(b, "g-1"); !ok || m != "yRvya2xuRRCNG+Aw7yMCLQ" || e != 2 {
		t.Fatalf("parse = %q, %d, %v; want the member id, epoch 2", m, e, ok)
	}
	if _, _, ok := parseGroupMetadata(b, "other"); ok {
		t.Fatal("metadata of another group accepted")
	}
	if _, _, ok := parseGroupMetadata([]byte("CGMDv3:xxxx"), "g-1"); ok {
		t.Fatal("an unknown metadata form accepted")
	}
	md, err := kafka.NewTestConsumerGroupMetadata("g-2")
	if err != nil {
		t.Fatal(err)
	}
	if m, e, ok := memberOf(md, "g-2"); !ok || m != "" || e > 0 {
		t.Fatalf("memberOf(test metadata) = %q, %d, %v; want the form read, no member, no epoch", m, e, ok)
	}
}
