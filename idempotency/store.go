package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/pg"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// DefaultRetention is how long Store keeps a claimed key when Store.Retention is zero:
// 7 days. A redelivery or re-publication later than that is treated as new work.
const DefaultRetention = 7 * 24 * time.Hour

// MaxKeyBytes is the longest key ClaimTx accepts, in bytes; MaxScopeBytes the longest scope.
// Together they keep the (scope, key) primary-key entry below PostgreSQL's B-tree limit of
// about 2,700 bytes per index tuple.
const (
	MaxKeyBytes   = 1024
	MaxScopeBytes = 512
)

// ErrEmptyKey is returned when a claim is made with an empty key.
var ErrEmptyKey = errors.New("idempotency: empty key")

// Store claims business idempotency keys in the idempotency_keys table of Schema. The zero
// value is ready to use: schema "kafkatx", keys kept for DefaultRetention.
type Store struct {
	// Schema holds kafkatx's tables. Defaults to "kafkatx".
	Schema string
	// Retention is how long a claimed key is remembered; once it has passed, the key counts
	// as never claimed and the Janitor deletes it. pg.KeepForever (any negative duration)
	// keeps keys forever. Defaults to DefaultRetention (7 days).
	Retention time.Duration
}

// ClaimTx records key in scope inside tx and reports whether this is the first claim: true
// means no committed transaction claimed (scope, key) before (or its claim expired) and the
// caller should do the work in tx; false means the work was done and must be skipped. It
// joins tx and never commits or rolls it back, so the claim is durable exactly when the
// caller's work is.
//
// It costs one statement, INSERT ... ON CONFLICT (scope, key) DO UPDATE ... WHERE expired,
// prepared once per connection by pgx, so it is cheap enough to call per message inside a
// batch transaction. If another open transaction claimed the same key, the statement waits
// for it to end: first == false if it committed, true if it rolled back (READ COMMITTED).
// Under REPEATABLE READ or SERIALIZABLE that case fails with SQLSTATE 40001 instead; retry
// the transaction.
//
// scope separates independent users of the table (for example "<group>/<replay epoch>" in
// a consumer, so that an operator's replay runs handlers again). Scope must be valid UTF-8
// without NUL bytes and at most MaxScopeBytes; key may hold any bytes, 1 to MaxKeyBytes.
func (s Store) ClaimTx(ctx context.Context, tx pgx.Tx, scope, key string) (first bool, err error) {
	if err := checkScopeKey(scope, key); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, claimSQL(s.schema()), scope, []byte(key), s.ttlMicros())
	if err != nil {
		return false, fmt.Errorf("idempotency: claim key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ttlMicros is the claim's lifetime for the SQL, in microseconds; nil keeps it forever.
func (s Store) ttlMicros() *int64 {
	ttl := s.Retention
	switch {
	case ttl == 0:
		ttl = DefaultRetention
	case ttl < 0:
		return nil
	}
	us := ttl.Microseconds()
	return &us
}

// Done reports whether (scope, key) has a committed, unexpired claim, without claiming it.
// q may be a pool, a connection or a transaction.
func (s Store) Done(ctx context.Context, q pg.Querier, scope, key string) (bool, error) {
	if err := checkScopeKey(scope, key); err != nil {
		return false, err
	}
	var done bool
	err := q.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE scope = $1 AND key = $2 AND expires_at > now())",
		keysTable(s.schema())), scope, []byte(key)).Scan(&done)
	if err != nil {
		return false, fmt.Errorf("idempotency: read key: %w", err)
	}
	return done, nil
}

// Forget deletes the claim of (scope, key), so that the next claim is first again (for
// example to re-run work on purpose). It reports whether a claim existed.
func (s Store) Forget(ctx context.Context, q pg.Querier, scope, key string) (bool, error) {
	if err := checkScopeKey(scope, key); err != nil {
		return false, err
	}
	tag, err := q.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE scope = $1 AND key = $2", keysTable(s.schema())), scope, []byte(key))
	if err != nil {
		return false, fmt.Errorf("idempotency: forget key: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

func (s Store) schema() string { return pg.SchemaOr(s.Schema) }

func checkScopeKey(scope, key string) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("idempotency: key of %d bytes is longer than %d", len(key), MaxKeyBytes)
	case len(scope) > MaxScopeBytes:
		return fmt.Errorf("idempotency: scope of %d bytes is longer than %d", len(scope), MaxScopeBytes)
	case !utf8.ValidString(scope):
		return errors.New("idempotency: scope is not valid UTF-8")
	}
	for i := 0; i < len(scope); i++ {
		if scope[i] == 0 {
			return errors.New("idempotency: scope holds a NUL byte")
		}
	}
	return nil
}

func keysTable(schema string) string { return tables.For(schema).Idempotency }

var claimSQLCache sync.Map // schema → SQL

// claimSQL inserts the key, or takes over an expired row; RowsAffected is 1 exactly when the
// claim is first. now() is the transaction's start time.
func claimSQL(schema string) string {
	if s, ok := claimSQLCache.Load(schema); ok {
		return s.(string)
	}
	t := keysTable(schema)
	s := fmt.Sprintf(`INSERT INTO %[1]s AS k (scope, key, expires_at)
VALUES ($1, $2, COALESCE(now() + $3::bigint * interval '1 microsecond', 'infinity'))
ON CONFLICT (scope, key) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= now()`, t)
	claimSQLCache.Store(schema, s)
	return s
}
