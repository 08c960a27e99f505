package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// ClaimManyTx claims every key of keys in scope inside tx with one statement and returns,
// per key, whether this was its first claim. A key repeated in keys is first at most once:
// at its first position. Semantics otherwise as ClaimTx (same table, retention, locking);
// the consumer loop calls it once per batch.
func (s Store) ClaimManyTx(ctx context.Context, tx pgx.Tx, scope string, keys []string) ([]bool, error) {
	first := make([]bool, len(keys))
	if len(keys) == 0 {
		return first, nil
	}
	schema := s.schema()
	pos := make(map[string]int, len(keys))
	uniq := make([][]byte, 0, len(keys))
	for i, k := range keys {
		if err := checkScopeKey(scope, k); err != nil {
			return nil, err
		}
		if _, dup := pos[k]; dup {
			continue
		}
		pos[k] = i
		uniq = append(uniq, []byte(k))
	}
	// One lock order for every batch, so concurrent batches with overlapping keys do not
	// deadlock.
	slices.SortFunc(uniq, bytes.Compare)
	rows, err := tx.Query(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS k (scope, key, expires_at)
SELECT $1, u.key, COALESCE(now() + $3::bigint * interval '1 microsecond', 'infinity') FROM unnest($2::bytea[]) AS u(key)
ON CONFLICT (scope, key) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= now()
RETURNING k.key`, keysTable(schema)), scope, uniq, s.ttlMicros())
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("idempotency: claim keys: %w", err)
		}
		first[pos[string(k)]] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotency: claim keys: %w", err)
	}
	return first, nil
}
