package publish

import (
	"errors"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Class is what a produce or delivery error means for the record.
type Class int

const (
	// Retry: the record may be accepted later unchanged (the broker or the network, a
	// timeout, a missing cluster-level ACL): it stays unpublished and is tried again. In WAL
	// mode that aborts the Kafka transaction and restarts the stream.
	Retry Class = iota
	// Park: refused for good, until an operator changes the record or the topic: the record
	// is parked with its error (kafkatx outbox list shows it) and the others flow.
	Park
	// Isolate: refused with a record-level error while batched with others: the broker
	// refuses a whole batch for one bad record, so which one is at fault is unknown. Each is
	// sent again alone; the one refused alone is parked (Classify with alone true).
	Isolate
)

func (c Class) String() string {
	switch c {
	case Park:
		return "park"
	case Isolate:
		return "isolate"
	}
	return "retry"
}

// refusal is one librdkafka error code's outcome and the reason for it.
type refusal struct {
	recordLevel bool // the record's own fault: Isolate while batched, Park alone
	class       Class
	reason      string
}

// refusals holds every librdkafka error code (rdkafka.h's rd_kafka_resp_err_t, Kafka's
// protocol error list) that a relay does not simply retry, and the retried ones the two
// relays once disagreed on, with the reason for each outcome. A code not listed is retried.
var refusals = map[kafka.ErrorCode]refusal{
	// Record-level: the broker refuses the whole batch the record travels in.
	kafka.ErrMsgSizeTooLarge:    {true, Park, "MESSAGE_TOO_LARGE: over librdkafka's message.max.bytes or the topic's max.message.bytes; the same bytes are refused again"},
	kafka.ErrRecordListTooLarge: {true, Park, "RECORD_LIST_TOO_LARGE: the batch is over the broker's limit; alone, the record itself is"},
	kafka.ErrInvalidMsgSize:     {true, Park, "INVALID_MSG_SIZE: the record's size is invalid for the broker"},
	kafka.ErrInvalidRecord:      {true, Park, "INVALID_RECORD: the broker's validation refuses the record (a nil key on a compacted topic is one)"},

	// Topic-level: every record for that topic or partition is refused until an operator acts.
	kafka.ErrUnknownTopic:             {false, Park, "the topic does not exist (after librdkafka's topic.metadata.propagation.max.ms)"},
	kafka.ErrUnknownPartition:         {false, Park, "the record names a partition the topic does not have"},
	kafka.ErrUnknownTopicOrPart:       {false, Park, "UNKNOWN_TOPIC_OR_PARTITION: the topic or partition does not exist"},
	kafka.ErrTopicException:           {false, Park, "INVALID_TOPIC_EXCEPTION: the topic's name is invalid"},
	kafka.ErrTopicAuthorizationFailed: {false, Park, "TOPIC_AUTHORIZATION_FAILED: no Write ACL on the topic; retrying would hold every later record of its key"},
	kafka.ErrPolicyViolation:          {false, Park, "POLICY_VIOLATION: a broker policy refuses the record"},
	// Parked (the WAL relay used to retry it, restarting its stream and holding the slot for
	// ever): the topic's message format (message.format.version before 0.11) cannot carry
	// headers, and every outbox record has the kafkatx-outbox-id header, so no retry succeeds
	// until an operator changes the topic.
	kafka.ErrUnsupportedForMessageFormat: {false, Park, "UNSUPPORTED_FOR_MESSAGE_FORMAT: the topic's message format cannot carry the record (headers need format 0.11 or later)"},

	// Retried, on purpose.
	// CORRUPT_MESSAGE (the WAL relay used to park it): a CRC mismatch in transit; Kafka's own
	// clients treat it as retriable (CorruptRecordException is a RetriableException), and the
	// same bytes sent again are accepted.
	kafka.ErrInvalidMsg: {false, Retry, "CORRUPT_MESSAGE: a checksum failed in transit; retriable in Kafka's protocol"},
	// INVALID_REQUIRED_ACKS (the WAL relay used to park it): the producer's acks setting, not
	// the record, is at fault (both relays force acks=all); parking would park every record.
	kafka.ErrInvalidRequiredAcks: {false, Retry, "INVALID_REQUIRED_ACKS: the producer's acks setting, not the record; parking would park every record"},
	// A missing IdempotentWrite ACL would otherwise park every record.
	kafka.ErrClusterAuthorizationFailed: {false, Retry, "CLUSTER_AUTHORIZATION_FAILED: a cluster-level ACL (IdempotentWrite) is missing, for every record alike"},
	kafka.ErrMsgTimedOut:                {false, Retry, "message.timeout.ms passed without an acknowledgement: the broker or the network"},
}

// Classify says what err, a produce or delivery error, means for the record: Park, Isolate or
// Retry, and why (from refusals). alone says whether the record was the only one of its
// partition in flight, so a record-level refusal is its own and not a batch neighbour's. An
// error that is not a kafka.Error is retried.
func Classify(err error, alone bool) (Class, string) {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return Retry, "not a Kafka error"
	}
	return ClassifyCode(ke.Code(), alone)
}

// ClassifyCode is Classify for a librdkafka error code.
func ClassifyCode(code kafka.ErrorCode, alone bool) (Class, string) {
	r, ok := refusals[code]
	switch {
	case !ok:
		return Retry, "retriable: may be accepted later unchanged"
	case r.recordLevel && !alone:
		return Isolate, r.reason + " (refused with its batch: each record is sent alone to find the one at fault)"
	}
	return r.class, r.reason
}
