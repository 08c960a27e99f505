package dlq

import (
	"strconv"
	"time"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Headers added to a dead letter published through the outbox (docs/design.md, "Poison pills and
// retries"). Numbers are decimal text; times are Unix epoch milliseconds, decimal text, as
// Kafka record timestamps are.
const (
	HeaderOriginalTopic     = "kafkatx.dlq.original.topic"
	HeaderOriginalPartition = "kafkatx.dlq.original.partition"
	HeaderOriginalOffset    = "kafkatx.dlq.original.offset"
	HeaderOriginalTimestamp = "kafkatx.dlq.original.timestamp" // omitted when the record had none
	// HeaderOriginalOutboxID carries the original record's kafkatx-outbox-id header, if it
	// had one: the relay gives the dead-letter record its own.
	HeaderOriginalOutboxID = "kafkatx.dlq.original.kafkatx-outbox-id"
	HeaderGroup            = "kafkatx.dlq.group"
	HeaderAttempts         = "kafkatx.dlq.attempts"
	HeaderErrorClass       = "kafkatx.dlq.error.class"
	HeaderErrorMessage     = "kafkatx.dlq.error.message" // at most MaxErrorMessageHeaderBytes
	HeaderFirstFailure     = "kafkatx.dlq.first.failure"
	HeaderLastFailure      = "kafkatx.dlq.last.failure"
	HeaderID               = "kafkatx.dlq.id" // the dead_letters row id, when known
)

// MaxErrorMessageHeaderBytes bounds the kafkatx.dlq.error.message header, in bytes (cut at a
// UTF-8 boundary).
const MaxErrorMessageHeaderBytes = 1024

// Record builds the outbox record that publishes d to topic (usually d.Topic + ".dlq"): the
// original key (nil stays nil), value and headers byte for byte, followed by the kafkatx.dlq.*
// headers above. An original kafkatx-outbox-id header is renamed to HeaderOriginalOutboxID so
// that the dead-letter record's own id is the only one. Write it with outbox.WriteTx in the
// transaction that inserts d (InsertTx), so the two commit together.
func Record(topic string, d *DeadLetter) outbox.Record {
	hs := make([]outbox.Header, 0, len(d.Headers)+12)
	for _, h := range d.Headers {
		if h.Key == outbox.HeaderOutboxID {
			h.Key = HeaderOriginalOutboxID
		}
		hs = append(hs, outbox.Header{Key: h.Key, Value: h.Value})
	}
	add := func(k, v string) { hs = append(hs, outbox.Header{Key: k, Value: []byte(v)}) }
	add(HeaderOriginalTopic, d.Topic)
	add(HeaderOriginalPartition, strconv.FormatInt(int64(d.Partition), 10))
	add(HeaderOriginalOffset, strconv.FormatInt(d.Offset, 10))
	if !d.Timestamp.IsZero() {
		add(HeaderOriginalTimestamp, millis(d.Timestamp))
	}
	add(HeaderGroup, d.Group)
	add(HeaderAttempts, strconv.Itoa(d.Attempts))
	add(HeaderErrorClass, pg.SanitizeText(d.ErrorClass, 64))
	add(HeaderErrorMessage, pg.SanitizeText(d.ErrorMessage, MaxErrorMessageHeaderBytes))
	if !d.FirstFailureAt.IsZero() {
		add(HeaderFirstFailure, millis(d.FirstFailureAt))
	}
	if !d.LastFailureAt.IsZero() {
		add(HeaderLastFailure, millis(d.LastFailureAt))
	}
	if d.ID != 0 {
		add(HeaderID, strconv.FormatInt(d.ID, 10))
	}
	return outbox.Record{Topic: topic, Key: d.Key, Value: d.Value, Headers: hs}
}

func millis(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
