// Package kafkatx is an exactly-once-style consumer loop for Kafka services that keep their
// state in PostgreSQL.
//
// Per batch of one partition, the handler's writes, the partition's processed watermark, any
// business idempotency claim, attempt row, dead letter and outbox record commit in one
// PostgreSQL transaction, and only after that commit is the offset committed to Kafka. The
// database leads: on every assignment the watermark is reconciled with Kafka's committed
// offset (docs/offsets.md), and every disagreement is audited. Attempt counts are durable, so a
// message that crashes the process reaches the dead-letter queue after Config.Retry.MaxAttempts
// tries instead of blocking its partition forever.
//
// Start with NewConsumer (a Handler per message) or NewBatchConsumer (a BatchHandler per batch)
// and Consumer.Run. Handlers control the loop with the errors they return: Permanent
// dead-letters at once, FailMessage names the failing message of a batch, Unavailable waits
// for a dependency without counting an attempt; any other error is retried with backoff.
//
// Related packages: outbox (records published iff their transaction commits) and
// outbox/relay (the publisher, also the `kafkatx relay` sidecar); dlq (dead letters);
// idempotency (business keys, the Idempotency-Key HTTP middleware, the Airflow client); pg
// (what they share about PostgreSQL); kafkatxtest (run a handler the way the loop would, in a
// rolled-back transaction, without Kafka) and kafkatxtest/kafkatxbroker (an in-process broker
// for whole-loop tests). docs/design.md states the guarantees and maps the code.
package kafkatx
