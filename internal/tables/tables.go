// Package tables names kafkatx's tables inside a configurable schema, quoted once with
// pgx.Identifier so no caller formats user input into SQL.
package tables

import "github.com/jackc/pgx/v5"

// Names holds the quoted, schema-qualified names of kafkatx's tables. Every table, schema
// function and schema name kafkatx's SQL names is built here: no other package quotes them.
type Names struct {
	Schema string // unquoted schema name
	// QuotedSchema is Schema quoted as one identifier, for CREATE SCHEMA and search_path.
	QuotedSchema string
	Watermarks   string
	Attempts     string
	DeadLetters  string
	OffsetAudit  string
	Outbox       string
	Idempotency  string
	Migrations   string
	// The audit trails of dead-letter and outbox actions, the relay's commit log, and
	// httpmw's stored responses.
	DLQAudit             string
	OutboxAudit          string
	OutboxCommits        string
	IdempotencyResponses string
	// DoneOffsets lists offsets above a watermark already applied (Config.Concurrency > 1).
	DoneOffsets string
	// OutboxSettings holds the outbox's mode (table or wal), slot and publication.
	OutboxSettings string
	// PartitionSamples holds the console's per-partition lag samples.
	PartitionSamples string
	// AirflowLedger records each DAG run or asset event a consumer handed to Airflow;
	// AirflowPending the asset events about to be posted (migration 014).
	AirflowLedger  string
	AirflowPending string
	// ShardDirectory maps each partition of a group to its shard (migration 016).
	ShardDirectory string
	// KeyParking holds a consumer group's parked keys' messages (internal/parking).
	KeyParking string
	// OutboxIdentifier is the outbox table for pgx's CopyFrom.
	OutboxIdentifier pgx.Identifier
}

// For returns the quoted table names in schema.
func For(schema string) Names {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	return Names{
		Schema:       schema,
		QuotedSchema: pgx.Identifier{schema}.Sanitize(),
		Watermarks:   q("watermarks"),
		Attempts:     q("attempts"),
		DeadLetters:  q("dead_letters"),
		OffsetAudit:  q("offset_audit"),
		Outbox:       q("outbox"),
		Idempotency:  q("idempotency_keys"),
		Migrations:   q("schema_migrations"),

		DLQAudit:             q("dlq_audit"),
		OutboxAudit:          q("outbox_audit"),
		OutboxCommits:        q("outbox_commits"),
		IdempotencyResponses: q("idempotency_responses"),
		DoneOffsets:          q("done_offsets"),
		OutboxSettings:       q("outbox_settings"),
		PartitionSamples:     q("partition_samples"),
		ShardDirectory:       q("shard_directory"),
		AirflowLedger:        q("airflow_ledger"),
		AirflowPending:       q("airflow_pending"),
		KeyParking:           q("key_parking"),
		OutboxIdentifier:     pgx.Identifier{schema, "outbox"},
	}
}

// Func returns the quoted, schema-qualified name of one of kafkatx's functions in the schema
// (the migrations' outbox_emit, outbox_set_mode), for SELECT schema.name(...).
func (n Names) Func(name string) string { return pgx.Identifier{n.Schema, name}.Sanitize() }

// Table is one table's quoted name (for SQL) and its identifier (for pgx's CopyFrom).
type Table struct {
	Quoted     string
	Identifier pgx.Identifier
}

// PartitionState lists kafkatx's tables whose rows belong to one partition of a consumer
// group (columns group_id, topic, partition) and move with it between shards, the watermarks
// last (package shards' Move writes them last and deletes them first).
func (n Names) PartitionState() []Table {
	var out []Table
	for _, t := range []string{"attempts", "done_offsets", "key_parking", "dead_letters", "watermarks"} {
		id := pgx.Identifier{n.Schema, t}
		out = append(out, Table{Quoted: id.Sanitize(), Identifier: id})
	}
	return out
}
