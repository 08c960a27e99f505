package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/outboxpack"
	"github.com/kafkatx/kafkatx/pg"
)

// Packed rows (state 'packed', migration 015; docs/outbox-table.md#packed-rows) hold several
// records of one transaction. A round reads a pack whole and unpacks it into one row value
// per record, in write order, each under its own id (pack_ids) and the pack's transaction,
// commit_seq and created_at; from there a record goes through the round as a plain row does.
// The mark then removes the pack row, and inserts each record that was not delivered as a
// plain row under its own id, in the same transaction: refused for good ones parked, the
// others pending (packMarks). So a pack row is never left half published, a bad record is
// parked alone while its row-mates are published, and the operator commands, which act on
// plain parked rows, need no change. A record's id lies between the ids of the rows its
// transaction wrote before and after it, so the plain row keeps its place in write order.

// packRead is a packed row as fetch read it: at is its index in the rows read.
type packRead struct {
	at    int
	row   row
	bytes []byte
	ids   []int64
}

// unpack replaces each pack of out with its records, and flags those whose (topic, key) has
// a parked row (behindParked: they wait, as a plain row of that key is not read). anyParked:
// the read saw a parked row; without one no key is checked (the usual state: sending a
// round's keys to be checked cost more than the rest of unpacking).
func (r *Relay) unpack(ctx context.Context, out []row, packs []packRead, anyParked bool) ([]row, error) {
	n := len(out) - len(packs)
	recs := make([][]outboxpack.Record, len(packs))
	for i, pk := range packs {
		rs, err := outboxpack.Decode(pk.bytes)
		if err != nil {
			return nil, fmt.Errorf("outbox row %d: %w", pk.row.id, err)
		}
		if len(rs) != len(pk.ids) {
			return nil, fmt.Errorf("outbox row %d: a pack of %d records has %d ids", pk.row.id, len(rs), len(pk.ids))
		}
		recs[i] = rs
		n += len(rs)
	}
	res := make([]row, 0, n)
	var topics []string
	var keys [][]byte
	var keyed []int // indexes in res of the records of packs that have a key
	prev := 0
	for i, pk := range packs {
		res = append(res, out[prev:pk.at]...)
		prev = pk.at + 1
		for j, rec := range recs[i] {
			w := pk.row
			w.pack, w.id = pk.row.id, pk.ids[j]
			w.outboxID = uuid.UUID(rec.OutboxID).String()
			w.topic, w.key, w.value, w.partition = rec.Topic, rec.Key, rec.Value, rec.Partition
			w.hk, w.hv = rec.HK, rec.HV
			if w.hk == nil {
				w.hk, w.hv = [][]byte{}, [][]byte{}
			}
			if w.key != nil {
				keyed = append(keyed, len(res))
				topics, keys = append(topics, w.topic), append(keys, w.key)
			}
			res = append(res, w)
		}
	}
	res = append(res, out[prev:]...)
	if len(keyed) == 0 || !anyParked {
		return res, nil
	}
	// The first arm is evaluated once (no parked row: the usual state, nothing hashed).
	rows, err := r.pool.Query(ctx, `SELECT u.i FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS u(t, k, i)
		WHERE EXISTS (SELECT 1 FROM `+r.t.Outbox+` p0 WHERE p0.state = 'parked')
		  AND EXISTS (SELECT 1 FROM `+r.t.Outbox+` p WHERE p.state = 'parked'
			AND md5(p.topic) = md5(u.t) AND sha256(p.key) = sha256(u.k) AND p.topic = u.t AND p.key = u.k)`, topics, keys)
	if err != nil {
		return nil, fmt.Errorf("check the parked keys of packed rows: %w", err)
	}
	behind, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("check the parked keys of packed rows: %w", err)
	}
	for _, i := range behind {
		res[keyed[i-1]].behindParked = true
	}
	return res, nil
}

// packMark is what a mark does to the packs of its rows: packIDs (each once) are removed,
// and the records listed after them, which were not delivered, inserted as plain rows.
type packMark struct {
	packIDs   []int64
	delivered []int32 // per pack: records delivered (pack_count of a KeepPublished row)
	// the records to insert, in order
	pack, id       []int64
	oid            []string
	topic          []string
	key, value     [][]byte
	partition      []*int32
	hFrom, hTo     []int32
	hKeys, hValues [][]byte
	state          []string
	attempts       []int32
	lastError      []*string
	plainRows      []row    // the rows that are not records of a pack
	plainResults   []result // their outcomes
}

// packMarks splits a mark's rows into plain rows and the packs' records.
func packMarks(rows []row, results []result) packMark {
	var m packMark
	hasPack := false
	for i := range rows {
		if rows[i].pack != 0 {
			hasPack = true
			break
		}
	}
	if !hasPack {
		m.plainRows, m.plainResults = rows, results
		return m
	}
	m.hKeys, m.hValues = [][]byte{}, [][]byte{}
	at := map[int64]int{}
	for i := range rows {
		w, res := &rows[i], results[i]
		if w.pack == 0 {
			m.plainRows, m.plainResults = append(m.plainRows, *w), append(m.plainResults, res)
			continue
		}
		p, seen := at[w.pack]
		if !seen {
			p = len(m.packIDs)
			at[w.pack] = p
			m.packIDs, m.delivered = append(m.packIDs, w.pack), append(m.delivered, 0)
		}
		var state string
		var attempts int32
		var lastErr *string
		switch res.outcome {
		case outcomeDelivered:
			m.delivered[p]++
			continue
		case outcomePark:
			state, attempts = "parked", 1
			e := pg.SanitizeText(res.err.Error(), 1024)
			lastErr = &e
		case outcomeRetry, outcomeIsolate:
			state, attempts = "pending", 1
			e := pg.SanitizeText(res.err.Error(), 1024)
			lastErr = &e
		default: // not produced: behind a parked row, a missing topic, a round cut short
			state = "pending"
		}
		m.pack, m.id, m.oid = append(m.pack, w.pack), append(m.id, w.id), append(m.oid, w.outboxID)
		m.topic, m.key, m.value, m.partition = append(m.topic, w.topic), append(m.key, w.key), append(m.value, w.value), append(m.partition, w.partition)
		m.hFrom = append(m.hFrom, int32(len(m.hKeys))+1)
		m.hKeys, m.hValues = append(m.hKeys, w.hk...), append(m.hValues, w.hv...)
		m.hTo = append(m.hTo, int32(len(m.hKeys)))
		m.state, m.attempts, m.lastError = append(m.state, state), append(m.attempts, attempts), append(m.lastError, lastErr)
	}
	return m
}

// queue adds the packs' statements to b: remove the packs (delete them, or mark them
// published with keepPublished) and insert their undelivered records as plain rows, then drop
// the outbox_commits row those inserts gave the mark's own transaction.
func (m *packMark) queue(b *pgx.Batch, outbox, commits string, keepPublished bool) {
	if len(m.packIDs) == 0 {
		return
	}
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	// By id = ANY: an index probe per pack, whatever the table's statistics say (a join with
	// unnest was planned as a scan of the whole outbox once dead rows filled it).
	remove := `DELETE FROM ` + outbox + ` o WHERE o.id = ANY(` + arg(m.packIDs) + `::bigint[]) AND o.state = 'packed'
		RETURNING o.id, o.txid, o.created_at`
	if keepPublished {
		remove = `UPDATE ` + outbox + ` o SET state = 'published', resolved_at = now(), attempts = o.attempts + 1,
			pack_count = (` + arg(m.delivered) + `::integer[])[array_position($1::bigint[], o.id)]
			WHERE o.id = ANY($1::bigint[]) AND o.state = 'packed' RETURNING o.id, o.txid, o.created_at`
	}
	if len(m.id) == 0 {
		b.Queue(remove, args...)
		return
	}
	b.Queue(`WITH d AS (`+remove+`)
		INSERT INTO `+outbox+` (id, outbox_id, topic, key, value, partition, header_keys, header_values, txid, created_at,
		                        state, attempts, last_error, parked_at)
		SELECT u.id, u.oid, u.topic, u.key, u.value, u.part, (`+arg(m.hKeys)+`::bytea[])[u.hfrom:u.hto], (`+arg(m.hValues)+`::bytea[])[u.hfrom:u.hto],
		       d.txid, d.created_at, u.state, u.attempts, u.err, CASE WHEN u.state = 'parked' THEN now() END
		  FROM unnest(`+arg(m.pack)+`::bigint[], `+arg(m.id)+`::bigint[], `+arg(m.oid)+`::uuid[], `+arg(m.topic)+`::text[],
		              `+arg(m.key)+`::bytea[], `+arg(m.value)+`::bytea[], `+arg(m.partition)+`::integer[], `+arg(m.hFrom)+`::integer[],
		              `+arg(m.hTo)+`::integer[], `+arg(m.state)+`::text[], `+arg(m.attempts)+`::integer[], `+arg(m.lastError)+`::text[])
		       WITH ORDINALITY AS u(pack, id, oid, topic, key, value, part, hfrom, hto, state, attempts, err, ord)
		  JOIN d ON d.id = u.pack
		 ORDER BY u.ord`, args...)
	// The insert's statement trigger (outbox_written) gave this transaction an outbox_commits
	// row; the records keep their writer's transaction, so it has no rows.
	b.Queue(`DELETE FROM ` + commits + ` WHERE txid = pg_current_xact_id()`)
}
