package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/kafkatx/kafkatx/outbox"
)

// The round's read checks the parked rows once per statement while none is parked, not once
// per row read (2 buffers a row when the planner chose the per-row probe), and with a row
// parked it still leaves out the rows of its key behind it. The statistics are those a
// vacuum of a drained outbox leaves (as in TestRangeDeleteIgnoresStaleStatistics), under
// which the planner chose the per-row probe; then 2,000 rows in two transactions and the
// read of 1,000 from the head, generic and custom plans.
func TestReadProbesTheParkedRowsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := New(b.pool, b.config(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO ` + b.t.Outbox + ` (topic, key, value) SELECT 'drained', convert_to('k-' || g, 'UTF8'), 'v' FROM generate_series(1, 40000) g`,
		`DELETE FROM ` + b.t.Outbox,
		`VACUUM ` + b.t.Outbox,
		`DELETE FROM ` + b.t.OutboxCommits,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var ids []int64
	for tx := 0; tx < 2; tx++ {
		recs := make([]outbox.Record, 1000)
		for i := range recs {
			recs[i] = outbox.Record{Topic: "read", Key: []byte(fmt.Sprintf("k-%d", i%100)), Value: []byte("v")}
		}
		ids = append(ids, b.write(t, recs...)...)
	}
	probes := func(root planNode) (loops float64) {
		root.walk(func(n planNode) {
			if n.Index == "outbox_parked_idx" {
				loops += n.Loops
			}
		})
		return loops
	}
	const types, args = "int, text[], bigint, bigint", "1000, '{}', 0, 0"
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		root := explainPrepared(t, b, mode, r.fetchSQL(), types, args)
		if root.Rows != 1000 {
			t.Fatalf("%s: read %v rows, want 1000", mode, root.Rows)
		}
		if n := probes(root); n > 1 {
			t.Errorf("%s, nothing parked: the parked rows probed %v times for 1,000 rows read, want at most once", mode, n)
		}
	}
	// Park the first row of key k-0: its later rows (every 100th) wait, the others are read.
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.t.Outbox+` SET state = 'parked', parked_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	rows, err := r.fetch(ctx, []string{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1000 {
		t.Fatalf("with a row parked: read %d rows, want 1000", len(rows))
	}
	for _, w := range rows {
		if string(w.key) == "k-0" {
			t.Fatalf("row %d of the parked key k-0 read", w.id)
		}
	}
	if rows[0].id != ids[1] {
		t.Errorf("first row read %d, want %d (the first of another key)", rows[0].id, ids[1])
	}
}
