package outbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/internal/outboxpack"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// PackMaxRecords and PackMaxBytes bound one packed row (Writer.Pack): a WriteTx call's
// records go into as few rows as these allow, in order.
const (
	PackMaxRecords = 1000
	PackMaxBytes   = 4 << 20
)

// packKeyLocks is the most keyed records of a pack whose key locks the writer computes:
// outbox_sequence takes one exclusive commit lock past 512 keyed records in a transaction.
const packKeyLocks = 512

// writePacks writes records as packed rows (state 'packed', migration 015) and returns each
// record's own id (pack_ids), ascending in the records' order. sids are the records' derived
// outbox ids (uuid.Nil or nil: random).
func (w Writer) writePacks(ctx context.Context, tx pgx.Tx, records []Record, sids []uuid.UUID) ([]int64, error) {
	schema := w.schema()
	random := bufio.NewReaderSize(rand.Reader, min(16*len(records), 64<<10))
	ids := make([]int64, 0, len(records))
	for from := 0; from < len(records); {
		e := outboxpack.NewEncoder(0)
		size := 0
		var topics []string
		var keys [][]byte
		keyed := 0
		to := from
		for ; to < len(records) && to-from < PackMaxRecords; to++ {
			r := &records[to]
			var hk, hv [][]byte
			if len(r.Headers) > 0 {
				hk, hv = make([][]byte, len(r.Headers)), make([][]byte, len(r.Headers))
				for j, h := range r.Headers {
					hk[j], hv[j] = []byte(h.Key), h.Value
					if hv[j] == nil {
						hv[j] = []byte{}
					}
				}
			}
			s := outboxpack.Size(r.Topic, r.Key, r.Value, hk, hv)
			if to > from && size+s > PackMaxBytes {
				break
			}
			size += s
			var id uuid.UUID
			if sids != nil && sids[to] != uuid.Nil {
				id = sids[to]
			} else {
				var err error
				if id, err = uuid.NewRandomFromReader(random); err != nil {
					return nil, fmt.Errorf("outbox: pack %d records: outbox_id: %w", len(records), err)
				}
			}
			e.Add(id, r.Topic, r.Key, r.Value, r.Partition, hk, hv)
			if r.Key != nil {
				keyed++
				if keyed <= packKeyLocks {
					topics, keys = append(topics, r.Topic), append(keys, r.Key)
				}
			}
		}
		if keyed > packKeyLocks {
			topics, keys = nil, nil // outbox_sequence takes the exclusive commit lock
		}
		n := to - from
		var got []int64
		err := tx.QueryRow(ctx, `WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence($1, 'id')::regclass AS seq),
			ids AS MATERIALIZED (SELECT array_agg(nextval(s.seq) ORDER BY g) AS a FROM s, generate_series(1, $2::integer) g)
			INSERT INTO `+tables.For(schema).Outbox+` (id, topic, state, pack, pack_count, pack_ids, pack_keyed, pack_key_hashes)
			SELECT nextval(s.seq), $3, 'packed', $4, $2, ids.a, $5,
			       (SELECT array_agg(DISTINCT hashtext(u.t || ':' || encode(u.k, 'hex'))) FROM unnest($6::text[], $7::bytea[]) AS u(t, k))
			  FROM s, ids
			RETURNING pack_ids`,
			tables.For(schema).Outbox, n, records[from].Topic, e.Bytes(), keyed, topics, keys).Scan(&got)
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "KX003" {
				forgetMode(tx, schema)
				return nil, fmt.Errorf("outbox: pack %d records: the outbox switched to WAL mode; retry the transaction: %w", n, err)
			}
			if errors.Is(err, pgx.ErrNoRows) {
				forgetMode(tx, schema)
				return nil, fmt.Errorf("outbox: pack %d records: the outbox switched to WAL mode; retry the transaction", n)
			}
			return nil, fmt.Errorf("outbox: pack %d records: %w", n, err)
		}
		if len(got) != n {
			return nil, fmt.Errorf("outbox: pack %d records: got %d ids", n, len(got))
		}
		ids = append(ids, got...)
		from = to
	}
	return ids, nil
}
