package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/outbox"
)

func TestDeliveredRunsBreakAtEveryRowNotDelivered(t *testing.T) {
	t.Parallel()
	ok, retry := result{outcome: outcomeDelivered}, result{outcome: outcomeRetry, err: errors.New("x")}
	rows := []row{
		{txid: 7, id: 1}, {txid: 7, id: 2}, {txid: 7, id: 5}, // one run: the mark's order, not id+1
		{txid: 7, id: 6},                                     // retried: breaks the run
		{txid: 7, id: 8}, {txid: 9, id: 3}, {txid: 9, id: 4}, // another transaction: a new run
		{txid: 7, id: 1}, // carried from a failed mark, back in an earlier place: a run of its own
	}
	results := []result{ok, ok, ok, retry, ok, ok, ok, ok}
	txids, los, his := deliveredRuns(rows, results)
	if want := []uint64{7, 7, 9, 7}; !slices.Equal(txids, want) {
		t.Fatalf("txids %v, want %v", txids, want)
	}
	if want := []int64{1, 8, 3, 1}; !slices.Equal(los, want) {
		t.Fatalf("lows %v, want %v", los, want)
	}
	if want := []int64{5, 8, 4, 1}; !slices.Equal(his, want) {
		t.Fatalf("highs %v, want %v", his, want)
	}
}

// A mark deletes its delivered rows by range of (txid, id). A range can hold a row the round
// never read (its topic set aside, or waiting behind a parked row of its key, or released by
// an operator after the read): that row must stay pending. Here rows 1, 3 and 5 of one
// transaction are marked delivered, row 4 retried and row 2 was not read: the range 1..3
// holds row 2, the mark falls back to deleting by id, and rows 2 and 4 stay pending.
func TestDeletingByRangeKeepsTheRowsInsideThatWereNotDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	core, logs := observer.New(zap.DebugLevel)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.Logger = zap.New(core)
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	read := func(ids []int64) []row {
		var out []row
		for _, id := range ids {
			w := row{id: id, topic: "t"}
			if err := b.pool.QueryRow(ctx, `SELECT txid FROM `+b.t.Outbox+` WHERE id = $1`, id).Scan(&w.txid); err != nil {
				t.Fatal(err)
			}
			out = append(out, w)
		}
		return out
	}
	recs := make([]outbox.Record, 5)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Key: []byte{byte('a' + i)}, Value: []byte("v")}
	}
	ids := b.write(t, recs...)
	ok, retry := result{outcome: outcomeDelivered}, result{outcome: outcomeRetry, err: errors.New("Broker: Request timed out")}
	if err := r.mark(ctx, read([]int64{ids[0], ids[2], ids[3], ids[4]}), []result{ok, ok, retry, ok}); err != nil {
		t.Fatal(err)
	}
	st := b.states(t)
	for _, i := range []int{0, 2, 4} {
		if s, left := st[ids[i]]; left {
			t.Errorf("delivered row %d left in the outbox (%s)", i+1, s)
		}
	}
	for _, i := range []int{1, 3} {
		if st[ids[i]] != "pending" {
			t.Errorf("row %d, not delivered: state %q, want pending", i+1, st[ids[i]])
		}
	}
	if n := logs.FilterMessageSnippet("deleting the delivered rows by id").Len(); n != 1 {
		t.Errorf("%d by-id fallbacks logged, want 1", n)
	}

	// Every row of a transaction delivered: one range, no fallback, nothing left.
	ids = b.write(t, recs...)
	if err := r.mark(ctx, read(ids), []result{ok, ok, ok, ok, ok}); err != nil {
		t.Fatal(err)
	}
	st = b.states(t)
	for i, id := range ids {
		if s, left := st[id]; left {
			t.Errorf("second transaction: delivered row %d left in the outbox (%s)", i+1, s)
		}
	}
	if n := logs.FilterMessageSnippet("deleting the delivered rows by id").Len(); n != 1 {
		t.Errorf("%d by-id fallbacks logged after a mark of whole ranges, want still 1", n)
	}
}

// The mark's range delete reads only its ranges whatever the table's statistics say. A vacuum
// of an outbox full of dead rows (a drained backlog) records a few hundred rows over
// thousands of pages; the outbox then fills again, and the plain join of the ranges with the
// table (the shape before) was planned from those figures: the whole outbox read for every
// mark (a sequential or bitmap scan of every open row, 25–50 ms a mark in a 300,000-order
// run). Here: 40,000 rows, all but 100 deleted, VACUUM, 40,000 rows written again in one
// transaction; the delete of a 1,000-row range of them, generic and custom plans, must read
// at most that range's rows from the table (the old shape, run the same way as a control,
// is logged).
func TestRangeDeleteIgnoresStaleStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	fill := `INSERT INTO ` + b.t.Outbox + ` (topic, key, value)
		SELECT 'stale', convert_to('k-' || g, 'UTF8'), convert_to('{"n":' || g || '}', 'UTF8') FROM generate_series(1, 40000) g`
	if _, err := b.pool.Exec(ctx, fill); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.t.Outbox+` WHERE id % 400 <> 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `VACUUM `+b.t.Outbox); err != nil {
		t.Fatal(err)
	}
	var reltuples float64
	var relpages int64
	if err := b.pool.QueryRow(ctx, `SELECT reltuples, relpages FROM pg_class WHERE oid = $1::regclass`, b.t.Outbox).Scan(&reltuples, &relpages); err != nil {
		t.Fatal(err)
	}
	if reltuples > 1000 || relpages < 100 {
		t.Fatalf("setup: the vacuum recorded %.0f rows over %d pages, want a few hundred over hundreds", reltuples, relpages)
	}
	if _, err := b.pool.Exec(ctx, fill); err != nil {
		t.Fatal(err)
	}
	var txid uint64
	var lo int64
	if err := b.pool.QueryRow(ctx, `SELECT txid, min(id) FROM `+b.t.Outbox+` WHERE id > $1 GROUP BY txid`, int64(40000)).Scan(&txid, &lo); err != nil {
		t.Fatal(err)
	}
	const rangeRows = 1000
	before := `DELETE FROM ` + b.t.Outbox + ` o USING unnest($1::xid8[], $2::bigint[], $3::bigint[]) AS d(txid, lo, hi)
		WHERE (o.txid, o.id) >= (d.txid, d.lo) AND (o.txid, o.id) <= (d.txid, d.hi)
		  AND o.state IN ('pending', 'parked') AND o.state = 'pending' RETURNING o.id`
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		for _, shape := range []struct {
			name, sql string
			control   bool
		}{{"deleteRangesSQL", deleteRangesSQL(b.t.Outbox), false}, {"the shape before", before, true}} {
			read, deleted := explainDelete(t, b, mode, shape.sql, txid, lo, lo+rangeRows-1)
			if deleted != rangeRows {
				t.Fatalf("%s, %s: deleted %d rows, want %d", shape.name, mode, deleted, rangeRows)
			}
			if shape.control {
				t.Logf("%s, %s: %d rows read from the outbox for a %d-row range", shape.name, mode, read, rangeRows)
				continue
			}
			if read > 2*rangeRows {
				t.Errorf("%s, %s: %d rows read from the outbox for a %d-row range; want at most %d", shape.name, mode, read, rangeRows, 2*rangeRows)
			}
		}
	}
}

// explainDelete runs sql (deleteRangesSQL's parameters: one range, txid lo..hi) under
// EXPLAIN ANALYZE with plan_cache_mode, as a prepared statement, in a transaction it rolls
// back, and returns the rows the plan's scans of the outbox read and the rows deleted.
func explainDelete(t *testing.T, b *testBundle, mode, sql string, txid uint64, lo, hi int64) (read, deleted int64) {
	t.Helper()
	root := explainPrepared(t, b, mode, sql, "xid8[], bigint[], bigint[]", fmt.Sprintf("'{%d}', '{%d}', '{%d}'", txid, lo, hi))
	root.walk(func(n planNode) {
		if n.Relation == "outbox" && strings.HasSuffix(n.Type, "Scan") {
			read += int64(n.Rows * n.Loops)
		}
	})
	return read, int64(root.Rows)
}

// explainPrepared prepares sql with the parameter types types, runs it with args (SQL
// literals: a utility statement takes no parameters) under EXPLAIN ANALYZE with
// plan_cache_mode, in a transaction it rolls back, and returns the plan's root.
func explainPrepared(t *testing.T, b *testBundle, mode, sql, types, args string) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `PREPARE explained(`+types+`) AS `+sql); err != nil {
		t.Fatal(err)
	}
	defer tx.Exec(ctx, `DEALLOCATE explained`) //nolint:errcheck
	var out []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, TIMING off, FORMAT JSON) EXECUTE explained(`+args+`)`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: %v (%s)", err, out)
	}
	return plans[0].Plan
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

// walk calls f on n and every node below it.
func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}
