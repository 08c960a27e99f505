// Package tables names kafkatx's tables inside a configurable schema, quoted once with
// pgx.Identifier so no caller formats user input into SQL.
package tables

import "github.com/jackc/pgx/v5"

// Names holds the quoted, schema-qualified names of kafkatx's tables.
type Names struct {
	Schema      string // unquoted schema name
	Watermarks  string
	Attempts    string
	DeadLetters string
	OffsetAudit string
	Outbox      string
	Idempotency string
	Migrations  string
	// The audit trails of dead-letter and outbox actions, the relay's commit log, and
	// httpmw's stored responses.
	DLQAudit             string
	OutboxAudit          string
	OutboxCommits        string
	IdempotencyResponses string
	// DoneOffsets lists offsets above a watermark already applied (Config.Concurrency > 1).
	DoneOffsets string
	// OutboxIdentifier is the outbox table for pgx's CopyFrom.
	OutboxIdentifier pgx.Identifier
}

// For returns the quoted table names in schema.
func For(schema string) Names {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	return Names{
		Schema:      schema,
		Watermarks:  q("watermarks"),
		Attempts:    q("attempts"),
		DeadLetters: q("dead_letters"),
		OffsetAudit: q("offset_audit"),
		Outbox:      q("outbox"),
		Idempotency: q("idempotency_keys"),
		Migrations:  q("schema_migrations"),

		DLQAudit:             q("dlq_audit"),
		OutboxAudit:          q("outbox_audit"),
		OutboxCommits:        q("outbox_commits"),
		IdempotencyResponses: q("idempotency_responses"),
		DoneOffsets:          q("done_offsets"),
		OutboxIdentifier:     pgx.Identifier{schema, "outbox"},
	}
}
