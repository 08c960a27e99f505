package kafkatx

import (
	"context"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/outbox"
)

// Handler processes one message inside the transaction that also advances the partition's
// watermark. It must do its database work through tx; tx.Commit and tx.Rollback return
// ErrTxOwnedByLoop and count as its failure (tx.Begin opens a savepoint). Returning an error
// rolls the transaction back; the message is retried with backoff until
// Config.Retry.MaxAttempts, then dead-lettered. Return Permanent(err) to dead-letter at once.
// The transaction is run again without counting an attempt only when ctx is done (shutdown,
// a lost partition), the error holds a PostgreSQL error that is not the statement's — a lost
// race, run again at once, or the server's own condition, waited out like Unavailable and
// bounded by Config.UnavailableMaxWait (the classification, code by code:
// docs/failures.md) — or tx's connection was lost and the error is not the handler's own
// context ending; the handler's own timeout or cancellation (a context it derived from ctx)
// and its own network errors are attempts. A panic is recovered and counted as an attempt.
// Honour ctx: a call that runs past Config.Transaction's statement plus idle timeouts is
// reported stuck, and on shutdown one that ignores ctx is abandoned (its transaction rolled
// back) Config.CloseTimeout after ctx ends.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// BatchHandler processes messages of one partition, in offset order, inside the one
// transaction that also advances the watermark past them — for bulk writes (COPY or a
// multi-row INSERT). It may be called with any contiguous run of messages, down to one: when
// a batch fails, kafkatx rolls it back and isolates the failing message. Return
// FailMessage(m, err) to name the message that failed (its neighbours are re-run as a batch
// without it); any other error makes kafkatx re-run the batch one message per transaction to
// find it. Retry, Permanent and panic rules are those of Handler.
type BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// perMessage runs h over a batch, naming the failing message and recovering its panic.
func perMessage(h Handler) BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		for _, m := range msgs {
			if err := callOne(ctx, tx, h, m); err != nil {
				return &MessageError{Offset: m.Offset, Err: err}
			}
		}
		return nil
	}
}

// The test kit stamps the messages it builds with the loop's outbox source through
// engine.AttachSource (kafkatxtest), as toMessages stamps the loop's.
func init() {
	engine.AttachSource = func(m any, src *outbox.Source) { m.(*Message).source = src }
}

// callOne calls h for m with ctx carrying m's outbox source: the records h writes through
// outbox.WriteTx get ids derived from m (outbox.Source).
func callOne(ctx context.Context, tx pgx.Tx, h Handler, m *Message) error {
	ctx = outbox.WithSource(ctx, m.source)
	return engine.Call(func() error { return h(ctx, tx, m) })
}

// newBody is the transaction body that the loop and the test kit run for handler h (with its
// middleware and the group in its context), claiming business keys per idem in schema.
func newBody(h BatchHandler, idem IdempotencyConfig, schema string) *engine.Body[*Message] {
	b := &engine.Body[*Message]{Handler: h, Keyed: keyed, FromKafka: toMessages}
	if !idem.Disabled {
		b.Claims = &engine.Claims{Store: idempotency.Store{Schema: schema, Retention: idem.Retention}, Key: idem.Key}
	}
	return b
}

// keyed gives m to the idempotency key function.
func keyed(m *Message) idempotency.Message {
	k := idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Header: noHeaders}
	if len(m.Headers) > 0 {
		k.Header = m.Header // a method value: one allocation, only for a message with headers
	}
	return k
}

// noHeaders is idempotency.Message.Header of a message without headers.
func noHeaders(string) ([]byte, bool) { return nil, false }

// toMessages converts one try's polled records for the handler at attempt, each message with
// its outbox source in scope (the loop's "group/epoch/topic id": engine.Scopes.Sources). The messages, their sources and their
// headers are each one allocation for the batch, not one per message.
func toMessages(kms []*kafka.Message, attempt int, scope string) []*Message {
	n, nh := len(kms), 0
	for _, km := range kms {
		nh += len(km.Headers)
	}
	ms, srcs, out := make([]Message, n), make([]outbox.Source, n), make([]*Message, n)
	var hs []Header
	if nh > 0 {
		hs = make([]Header, 0, nh)
	}
	for i, km := range kms {
		m, src := &ms[i], &srcs[i]
		m.Topic, m.Partition, m.Offset = *km.TopicPartition.Topic, km.TopicPartition.Partition, int64(km.TopicPartition.Offset)
		m.Key, m.Value, m.Timestamp, m.Attempt = km.Key, km.Value, km.Timestamp, attempt
		if len(km.Headers) > 0 {
			from := len(hs)
			for _, h := range km.Headers {
				hs = append(hs, Header{Key: h.Key, Value: h.Value})
			}
			m.Headers = hs[from:len(hs):len(hs)] // full: an append by the handler copies
		}
		engine.StampSource(src, scope, m.Topic, m.Partition, m.Offset)
		m.source = src
		out[i] = m
	}
	return out
}
