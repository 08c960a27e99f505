package kafkatxtest

import (
	"time"

	"github.com/kafkatx/kafkatx"
)

// Timestamp is the record timestamp of the messages Messages and NewMessage build, fixed so
// that test output does not depend on the clock.
var Timestamp = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewMessage returns the record at topic, partition and offset with key and value (nil for a
// nil key or value) and headers in order, at attempt 1 and with Timestamp. Set its Attempt
// field to run it as a later try.
func NewMessage(topic string, partition int32, offset int64, key, value []byte, headers ...kafkatx.Header) *kafkatx.Message {
	return &kafkatx.Message{Topic: topic, Partition: partition, Offset: offset, Key: key, Value: value,
		Headers: headers, Timestamp: Timestamp, Attempt: 1}
}

// Messages returns one message per value on partition 0 of topic, at offsets 0, 1, 2, …,
// without keys or headers, at attempt 1 and with Timestamp.
func Messages(topic string, values ...string) []*kafkatx.Message {
	msgs := make([]*kafkatx.Message, len(values))
	for i, v := range values {
		msgs[i] = NewMessage(topic, 0, int64(i), nil, []byte(v))
	}
	return msgs
}

// Header returns the header key: value.
func Header(key, value string) kafkatx.Header { return kafkatx.Header{Key: key, Value: []byte(value)} }
