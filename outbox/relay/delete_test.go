package relay

import (
	"context"
	"errors"
	"slices"
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
