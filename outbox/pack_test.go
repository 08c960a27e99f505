package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/outbox"
)

// Writer.Pack puts a call's records into packed rows of at most PackMaxRecords records, each
// record with its own ascending id below its row's; packed rows block the switch to WAL mode
// as pending rows do; in WAL mode Pack is ignored (messages, no rows), and a packed row
// inserted there anyway (a writer that read the mode before the switch) fails with KX003.
func TestPackedRowsAndTheWALMode(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema, Pack: true}
	n := outbox.PackMaxRecords + 5
	recs := make([]outbox.Record, n)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Key: []byte(fmt.Sprint(i % 7)), Value: []byte("v")}
	}
	var ids []int64
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = w.WriteTx(ctx, tx, recs...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != n || !slices.IsSorted(ids) {
		t.Fatalf("%d ids, sorted %v; want %d ascending", len(ids), slices.IsSorted(ids), n)
	}
	rows, err := b.pool.Query(ctx, `SELECT id, pack_count, pack_ids FROM `+b.t.Outbox+` WHERE state = 'packed' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var counts []int
	var all []int64
	var id int64
	var count int
	var pids []int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &count, &pids}, func() error {
		if pids[len(pids)-1] >= id {
			return fmt.Errorf("row %d holds record id %d, not below its own", id, pids[len(pids)-1])
		}
		counts, all = append(counts, count), append(all, pids...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(counts, []int{outbox.PackMaxRecords, 5}) || !slices.Equal(all, ids) {
		t.Fatalf("packed rows of %v records; ids equal to WriteTx's: %v", counts, slices.Equal(all, ids))
	}
	if err := outbox.SetMode(ctx, b.pool, b.schema, outbox.ModeWAL); err == nil || !strings.Contains(err.Error(), "pending rows") {
		t.Fatalf("switch with packed rows: %v, want a refusal naming the pending rows", err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.t.Outbox); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = outbox.DropSlot(context.Background(), b.pool, b.schema, true)
		_, _ = b.pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{outbox.PublicationName(b.schema)}.Sanitize())
	})
	if _, err := outbox.EnsureMode(ctx, b.pool, b.schema, outbox.ModeWAL); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := w.WriteTx(ctx, tx, recs[:3]...)
		return err
	}); err != nil {
		t.Fatalf("WriteTx with Pack in WAL mode: %v", err)
	}
	var stored int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("%d rows stored in WAL mode (%v); want none", stored, err)
	}
	_, err = b.pool.Exec(ctx, `INSERT INTO `+b.t.Outbox+` (topic, state, pack, pack_count, pack_ids) VALUES ('t', 'packed', '\x0100', 1, '{1}')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "KX003" {
		t.Fatalf("a packed row inserted in WAL mode: %v; want SQLSTATE KX003", err)
	}
}
