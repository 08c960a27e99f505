// Package pg holds what kafkatx's packages share about PostgreSQL: the default name of the
// schema that holds kafkatx's tables, and the Querier that functions accept when they run
// single statements and open no transaction of their own.
//
// The transaction convention every public package follows (docs/design.md, "Conventions"): a
// function whose name ends in Tx takes a pgx.Tx, joins that transaction and never commits or
// rolls it back; a function that takes a Querier runs its statements on it, so a pool, a
// connection or a transaction all do; a function that needs a transaction of its own takes a
// *pgxpool.Pool and commits it before returning.
package pg

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSchema is the schema of kafkatx's tables when none is configured.
const DefaultSchema = "kafkatx"

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SchemaOr returns schema, or DefaultSchema when schema is empty.
func SchemaOr(schema string) string {
	if schema == "" {
		return DefaultSchema
	}
	return schema
}

// KeepForever, as a retention setting (idempotency keys, stored HTTP responses, published
// outbox rows, resolved dead letters, attempt rows), keeps the rows forever: any negative
// duration does. Zero always means the setting's documented default.
const KeepForever time.Duration = -1

// SanitizeText makes s storable in a PostgreSQL text column: invalid UTF-8 becomes U+FFFD,
// NUL becomes U+2400 (␀), and the result is cut to at most max bytes at a rune boundary.
func SanitizeText(s string, max int) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) && len(s) <= max {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\u2400")
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}
