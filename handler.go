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

// callOne calls h for m with ctx carrying m's outbox source: the records h writes through
// outbox.WriteTx get ids derived from m (outbox.Source).
func callOne(ctx context.Context, tx pgx.Tx, h Handler, m *Message) error {
	ctx = outbox.WithSource(ctx, m.source)
	return engine.Call(func() error { return h(ctx, tx, m) })
}

// newBody is the transaction body that the loop and the test kit run for handler h (with its
// middleware and the group in its context), claiming business keys per idem in schema.
func newBody(h BatchHandler, idem IdempotencyConfig, schema string) *engine.Body[*Message] {
	b := &engine.Body[*Message]{Handler: h, Keyed: keyed, FromKafka: toMessage, Scoped: sourced}
	if !idem.Disabled {
		b.Claims = &engine.Claims{Store: idempotency.Store{Schema: schema, Retention: idem.Retention}, Key: idem.Key}
	}
	return b
}

// keyed gives m to the idempotency key function.
func keyed(m *Message) idempotency.Message {
	return idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Header: m.Header}
}

// sourced gives m its outbox source in scope (the loop's "group/epoch/topic id": engine.Scopes.Sources).
func sourced(m *Message, scope string) {
	m.source = &outbox.Source{Scope: scope, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
}

func toMessage(km *kafka.Message, attempt int) *Message {
	m := &Message{
		Topic:     *km.TopicPartition.Topic,
		Partition: km.TopicPartition.Partition,
		Offset:    int64(km.TopicPartition.Offset),
		Key:       km.Key,
		Value:     km.Value,
		Timestamp: km.Timestamp,
		Attempt:   attempt,
	}
	if len(km.Headers) > 0 {
		m.Headers = make([]Header, len(km.Headers))
		for i, h := range km.Headers {
			m.Headers[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}
