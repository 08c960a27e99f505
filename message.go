package kafkatx

import (
	"context"
	"time"

	"github.com/kafkatx/kafkatx/outbox"
)

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

	// ctx is the message's own context, set by middleware with SetContext.
	ctx context.Context
	// source names m for the outbox ids of the records written for it; nil outside the loop.
	source *outbox.Source
}

// OutboxSource is m as the input of the outbox records written for it: set it as their
// outbox.Record.Source and each gets an outbox id derived from m's group, topic, partition,
// offset, replay epoch and log (the topic id) and its position among m's records (the same
// when m is processed again after a database rollback; new after an operator's replay, and
// for a recreated topic's message at a reused offset). A per-message Handler
// needs nothing: the ctx it is called with carries m's. A batch handler that writes the
// records of several messages in one WriteTx call names each record's message this way.
// Nil for a message that did not come from the loop (then ids are random).
func (m *Message) OutboxSource() *outbox.Source { return m.source }

// Context returns the message's own context: the one a middleware attached with SetContext
// (package kafkatxotel attaches the message's span, a child of the producer's trace context
// in its headers), else context.Background(). Use it to label work done for one message of a
// batch — for example the trace headers of the outbox record written for it; the handler's
// ctx argument stays the one that carries cancellation. As in Watermill's Message.Context.
// Inside the loop it also carries m's OutboxSource, so records written with
// outbox.WriteTx(m.Context(), …) get ids derived from m.
func (m *Message) Context() context.Context {
	c := m.ctx
	if c == nil {
		c = context.Background()
	}
	if m.source != nil && outbox.SourceFrom(c) != m.source {
		c = outbox.WithSource(c, m.source)
	}
	return c
}

// SetContext attaches ctx to m for the handler and later middleware (see Context). Derive
// ctx from the batch's ctx so that it keeps its cancellation. A nil ctx clears it.
func (m *Message) SetContext(ctx context.Context) { m.ctx = ctx }

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
