package outbox

import (
	"strconv"
	"time"

	"github.com/kafkatx/kafkatx/dlq"
)

// Headers added to a dead letter published through the outbox (docs/design.md, "Poison pills and
// retries"). Numbers are decimal text; times are Unix epoch milliseconds, decimal text, as
// Kafka record timestamps are.
const (
	HeaderDLQOriginalTopic     = "kafkatx.dlq.original.topic"
	HeaderDLQOriginalPartition = "kafkatx.dlq.original.partition"
	HeaderDLQOriginalOffset    = "kafkatx.dlq.original.offset"
	HeaderDLQOriginalTimestamp = "kafkatx.dlq.original.timestamp" // omitted when the record had none
	// HeaderDLQOriginalOutboxID carries the original record's kafkatx-outbox-id header, if it
	// had one: the relay gives the dead-letter record its own.
	HeaderDLQOriginalOutboxID = "kafkatx.dlq.original.kafkatx-outbox-id"
	HeaderDLQGroup            = "kafkatx.dlq.group"
	HeaderDLQAttempts         = "kafkatx.dlq.attempts"
	HeaderDLQErrorClass       = "kafkatx.dlq.error.class"
	HeaderDLQErrorMessage     = "kafkatx.dlq.error.message" // at most MaxDLQErrorMessageBytes
	HeaderDLQFirstFailure     = "kafkatx.dlq.first.failure"
	HeaderDLQLastFailure      = "kafkatx.dlq.last.failure"
	HeaderDLQID               = "kafkatx.dlq.id" // the dead_letters row id, when known
)

// MaxDLQErrorMessageBytes bounds the kafkatx.dlq.error.message header, in bytes (cut at a
// UTF-8 boundary).
const MaxDLQErrorMessageBytes = 1024

// DeadLetterRecord builds the record that publishes d to topic (usually d.Topic + ".dlq"):
// the original key (nil stays nil), value and headers byte for byte, followed by the
// kafkatx.dlq.* headers above. An original kafkatx-outbox-id header is renamed to
// HeaderDLQOriginalOutboxID so that the dead-letter record's own id is the only one.
func DeadLetterRecord(topic string, d *dlq.DeadLetter) Record {
	hs := make([]Header, 0, len(d.Headers)+12)
	for _, h := range d.Headers {
		if h.Key == HeaderOutboxID {
			h.Key = HeaderDLQOriginalOutboxID
		}
		hs = append(hs, Header{Key: h.Key, Value: h.Value})
	}
	add := func(k, v string) { hs = append(hs, Header{Key: k, Value: []byte(v)}) }
	add(HeaderDLQOriginalTopic, d.Topic)
	add(HeaderDLQOriginalPartition, strconv.FormatInt(int64(d.Partition), 10))
	add(HeaderDLQOriginalOffset, strconv.FormatInt(d.Offset, 10))
	if !d.Timestamp.IsZero() {
		add(HeaderDLQOriginalTimestamp, millis(d.Timestamp))
	}
	add(HeaderDLQGroup, d.Group)
	add(HeaderDLQAttempts, strconv.Itoa(d.Attempts))
	add(HeaderDLQErrorClass, dlq.SanitizeText(d.ErrorClass, 64))
	add(HeaderDLQErrorMessage, dlq.SanitizeText(d.ErrorMessage, MaxDLQErrorMessageBytes))
	if !d.FirstFailureAt.IsZero() {
		add(HeaderDLQFirstFailure, millis(d.FirstFailureAt))
	}
	if !d.LastFailureAt.IsZero() {
		add(HeaderDLQLastFailure, millis(d.LastFailureAt))
	}
	if d.ID != 0 {
		add(HeaderDLQID, strconv.FormatInt(d.ID, 10))
	}
	return Record{Topic: topic, Key: d.Key, Value: d.Value, Headers: hs}
}

func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
