package relay

import (
	"errors"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// errNilKeyOnCompactedTopic parks a row with a nil key for a topic whose cleanup.policy
// includes compact, before it is sent: the broker refuses such a record (INVALID_RECORD) with
// the whole batch it travels in, which sent every row of the batch again alone and could
// publish later rows of a key before earlier ones (20,000 rows with 5 nil keys: 10,691–11,423
// records produced alone, 4,438 per-key order breaks logged).
var errNilKeyOnCompactedTopic = errors.New("relay: a record with a nil key is refused by a compacted topic (cleanup.policy=compact); parked before sending")

// outcome is what a delivery result means for the row.
type outcome int

const (
	outcomeNone      outcome = iota // not produced this round (its key is blocked): stays pending
	outcomeDelivered                // acknowledged by the broker
	outcomeRetry                    // retriable failure: stays pending, tried again after a backoff
	outcomePark                     // refused for good: parked with its error
	outcomeIsolate                  // refused with a record-level error while batched: try it alone
)

// classify maps a produce or delivery error to an outcome. alone says whether the record was
// the only one in flight, so a record-level refusal is its own and not a batch neighbour's:
// the broker rejects a whole batch for one bad record (MESSAGE_TOO_LARGE, INVALID_RECORD).
//
// Refused for good: records too large (librdkafka's message.max.bytes, the topic's
// max.message.bytes), invalid records (a nil key on a compacted topic), topics that do not
// exist once librdkafka's topic.metadata.propagation.max.ms has passed, invalid topic
// names, missing topic authorization, and policy violations. Everything else is retried,
// including CLUSTER_AUTHORIZATION_FAILED (a missing IdempotentWrite ACL would otherwise park
// every row) and message timeouts.
func classify(err error, alone bool) outcome {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return outcomeRetry
	}
	switch ke.Code() {
	case kafka.ErrMsgSizeTooLarge, kafka.ErrRecordListTooLarge, kafka.ErrInvalidMsgSize, kafka.ErrInvalidRecord:
		if alone {
			return outcomePark
		}
		return outcomeIsolate
	case kafka.ErrUnknownTopic, kafka.ErrUnknownPartition, kafka.ErrUnknownTopicOrPart, kafka.ErrTopicException,
		kafka.ErrTopicAuthorizationFailed, kafka.ErrPolicyViolation, kafka.ErrUnsupportedForMessageFormat:
		return outcomePark
	}
	return outcomeRetry
}
