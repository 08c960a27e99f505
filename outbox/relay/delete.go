package relay

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// errRangeWider is returned (and the mark's transaction rolled back) when deleting a mark's
// delivered rows by range took a row that was not delivered: an open row lay inside a range
// without being read with it. The mark is then made again, deleting by id.
var errRangeWider = errors.New("relay: a delivered range held a row that was not delivered")

// deliveredRuns returns a mark's delivered rows as ranges of outbox_open_idx ((txid, id)):
// runs of rows that follow each other in the mark, belong to one transaction and were all
// delivered. A round reads a transaction's rows in id order, so a round of R delivered rows
// over T transactions gives about T ranges, not R ids.
//
// A range can hold rows the round did not read: rows of a topic set aside (missing), rows
// waiting behind a parked row of their key, a row released by an operator after the read.
// deleteRanges returns what it deleted so that the mark can tell (errRangeWider).
func deliveredRuns(rows []row, results []result) (txids []uint64, los, his []int64) {
	open := false
	for i := range rows {
		if results[i].outcome != outcomeDelivered {
			open = false
			continue
		}
		w := &rows[i]
		if n := len(txids); open && txids[n-1] == w.txid && w.id > his[n-1] {
			his[n-1] = w.id
			continue
		}
		txids, los, his = append(txids, w.txid), append(los, w.id), append(his, w.id)
		open = true
	}
	return txids, los, his
}

// deleteRanges queues the DELETE of the open rows inside the ranges of deliveredRuns and a
// check that each row it took is in delivered; when one is not, the batch fails with
// errRangeWider (and its transaction must roll back).
//
// Why ranges: deleting 1,000 rows by `id = ANY($1)` descends the primary key once per id,
// 4.4–5.7 µs a row on an idle 2-core machine (PostgreSQL 15); the same rows as ranges of
// outbox_open_idx took 1.2–1.5 µs a row, the same WAL (76 bytes a row).
//
// Why this shape: each range is read by its own index scan of outbox_open_idx (txid equal, id
// between the bounds: both bounds are the scan's start and stop keys), in a LATERAL subquery
// that OFFSET 0 keeps from being flattened into a join, and the rows found are deleted by
// ctid (a TID scan). So the plan cannot depend on the table's statistics. The plain join
// `DELETE ... USING unnest(...) WHERE (o.txid, o.id) >= (d.txid, d.lo) AND ...` was planned
// from them: once a vacuum of an outbox full of dead rows had recorded a few hundred rows over
// thousands of pages (reltuples 192 over 2,376 pages), the planner took the whole outbox for a
// few hundred rows and scanned all of it for every mark (a bitmap or sequential scan of every
// open row, 66,000–184,000 of them, 8,600 buffers, 25–50 ms a mark during a 300,000-order run;
// 198 ms against 1.4–2.2 ms for this shape on a 100,000-row outbox,
// TestRangeDeleteIgnoresStaleStatistics), and how often that happened depended on when
// autovacuum had run: one of the causes of the table pipeline's spread from run to run.
// A row updated between the subquery's read and the delete (an operator's release or
// discard touches parked rows only) is re-checked on its new version and left alone if it
// no longer matches: it stays for a later round.
func (r *Relay) deleteRanges(b *pgx.Batch, rows []row, results []result, delivered map[int64]bool) {
	txids, los, his := deliveredRuns(rows, results)
	b.Queue(deleteRangesSQL(r.t.Outbox), txids, los, his).Query(func(rs pgx.Rows) error {
		wider := 0
		for rs.Next() {
			var id int64
			if err := rs.Scan(&id); err != nil {
				return err
			}
			if !delivered[id] {
				wider++
			}
		}
		if err := rs.Err(); err != nil {
			return err
		}
		if wider > 0 {
			return fmt.Errorf("%w: %d rows", errRangeWider, wider)
		}
		return nil
	})
}

// deleteRangesSQL deletes the pending rows of outbox (quoted) inside the ranges
// ($1 txid, $2 lowest id, $3 highest id, one range per array position) and returns their ids.
func deleteRangesSQL(outbox string) string {
	return `DELETE FROM ` + outbox + ` o
		WHERE o.ctid = ANY (ARRAY(
			SELECT x.tid FROM unnest($1::xid8[], $2::bigint[], $3::bigint[]) AS d(txid, lo, hi)
			CROSS JOIN LATERAL (
				SELECT x.ctid AS tid FROM ` + outbox + ` x
				 WHERE x.txid = d.txid AND x.id >= d.lo AND x.id <= d.hi
				   AND x.state IN ('pending', 'parked') AND x.state = 'pending'
				OFFSET 0
			) x))
		  AND o.state = 'pending'
		RETURNING o.id`
}
