package kafkatx

import "time"

// Message is one Kafka record handed to a Handler, with its position and attempt number.
type Message struct {
	// Topic, Partition and Offset locate the record (its TPO).
	Topic     string
	Partition int32
	Offset    int64
	// Key is nil for a record without a key; an empty key is a non-nil empty slice.
	Key []byte
	// Value is the record value byte for byte; it may hold NUL bytes or invalid UTF-8.
	Value []byte
	// Headers in record order; keys may repeat.
	Headers []Header
	// Timestamp is the record's timestamp (CreateTime or LogAppendTime).
	Timestamp time.Time
	// Attempt is 1 on the first try and counts every try, including tries that crashed
	// the process, durably across restarts and rebalances.
	Attempt int
}

// Header is one record header. Value is nil for a header with a null value.
type Header struct {
	Key   string
	Value []byte
}

// Header returns the value of the last header named key, and whether there was one.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}
