// Package idempotency records business idempotency keys in PostgreSQL, inside the caller's
// transaction, so that a unit of work identified by a key other than its Kafka position (a
// header such as idempotency-key, a payload field, a CDC source position, an outbox id) takes
// effect once even when the same event arrives twice at different offsets.
//
// A key is claimed with Store.ClaimTx (or ClaimManyTx for a batch) in the transaction that does the
// work: the claim is an INSERT ... ON CONFLICT into the idempotency_keys table of kafkatx's
// schema, so it commits or rolls back with the work. "Claimed" therefore means "done": a
// claim that returns first == false means an earlier transaction with the same scope and key
// committed, and the work must be skipped. A concurrent transaction claiming the same key
// waits on the first one's row lock and then sees its outcome (PostgreSQL's unique index
// semantics under READ COMMITTED); under REPEATABLE READ or SERIALIZABLE it fails with a
// serialization failure (SQLSTATE 40001) instead, which callers retry.
//
// Keys expire: a key claimed with a retention period counts as absent once it has passed, and
// the Janitor deletes expired keys in small batches.
//
// KeyFunc derives a key from a Kafka message (FromHeader, FromJSONField, FromDebezium,
// FromOutboxID, FirstOf). It reads a Message, a small struct defined here so that this package
// does not import the root kafkatx package (which imports this one). FromDebezium keys a
// Debezium change by its identity (DebeziumEvent.Key, format "dbz2:") and answers
// ErrNotAChange for records that carry no change, which the kafkatx consumer skips.
//
// Subpackages: httpmw is net/http middleware for the Idempotency-Key request header (IETF
// httpapi draft "The Idempotency-Key HTTP Header Field"); airflow starts Apache Airflow DAG
// runs through its stable REST API v2 with a run id derived from an idempotency key.
//
// The tables are created by kafkatx's migrations (internal/migrations/sql/003_idempotency.sql),
// applied by kafkatx.Migrate or `kafkatx migrate up`.
package idempotency
