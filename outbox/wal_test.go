package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/outbox"
)

func walRecords() []outbox.Record {
	p := int32(2)
	return []outbox.Record{
		{Topic: "t1", Key: nil, Value: []byte{0, 0xff}, Headers: []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte{}}}},
		{Topic: "t2", Key: []byte{}, Value: nil, Partition: &p},
		{Topic: "t1", Key: []byte("k"), Value: []byte("v")},
	}
}

// A record survives AppendWAL and DecodeWAL byte for byte: nil and empty keys stay apart, a
// nil value stays a tombstone, headers and the partition are kept; a truncated or unknown
// message is an error wrapping ErrMalformedWAL, never a record.
func TestWALEncodingRoundTrip(t *testing.T) {
	for i, r := range walRecords() {
		b := outbox.AppendWAL(nil, &r)
		got, err := outbox.DecodeWAL(b)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, r) && !(len(r.Headers) == 0 && len(got.Headers) == 0 && got.Topic == r.Topic &&
			bytes.Equal(got.Key, r.Key) && (got.Key == nil) == (r.Key == nil) && bytes.Equal(got.Value, r.Value) && (got.Value == nil) == (r.Value == nil) &&
			reflect.DeepEqual(got.Partition, r.Partition)) {
			t.Fatalf("record %d: decoded %+v, want %+v", i, got, r)
		}
		if (got.Key == nil) != (r.Key == nil) || (got.Value == nil) != (r.Value == nil) {
			t.Fatalf("record %d: nil-ness of key or value changed", i)
		}
		for cut := 0; cut < len(b); cut++ {
			if _, err := outbox.DecodeWAL(b[:cut]); !errors.Is(err, outbox.ErrMalformedWAL) {
				t.Fatalf("record %d cut at %d: %v, want ErrMalformedWAL", i, cut, err)
			}
		}
	}
	if err := outbox.RangeWAL([]byte{9, 0}, func(int, outbox.Record) error { return nil }); !errors.Is(err, outbox.ErrMalformedWAL) {
		t.Fatalf("unknown version: %v", err)
	}
}

// The schema's SQL encoder (the plain-SQL trigger's) writes the same bytes as AppendWAL.
func TestSQLEncoderMatchesAppendWAL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for i, r := range walRecords() {
		var hk, hv [][]byte
		for _, h := range r.Headers {
			hk, hv = append(hk, []byte(h.Key)), append(hv, h.Value)
		}
		if hk == nil {
			hk, hv = [][]byte{}, [][]byte{}
		}
		var got []byte
		err := b.pool.QueryRow(ctx, `SELECT `+pgx.Identifier{b.schema}.Sanitize()+`.outbox_wal_encode($1, $2, $3, $4, $5, $6)`,
			r.Topic, r.Key, r.Value, r.Partition, hk, hv).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if want := outbox.AppendWAL(nil, &r); !bytes.Equal(got, want) {
			t.Fatalf("record %d: SQL encodes %x, Go %x", i, got, want)
		}
	}
}

// The mode is stored with the schema: a new schema is in table mode, not chosen; the first
// explicit choice (EnsureMode wal) creates the publication and the slot and switches; a later
// conflicting choice is ErrModeConflict; WriteTx then emits messages (no row, ids are WAL
// positions); a missing slot makes writers refuse (KX002); switching a table with pending
// rows to WAL is refused.
func TestModeIsStoredChosenOnceAndGuardsWriters(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	s, err := outbox.ReadSettings(ctx, b.pool, b.schema)
	if err != nil || s.Mode != outbox.ModeTable || s.Chosen {
		t.Fatalf("new schema: %+v, %v; want table, not chosen", s, err)
	}
	// Pending rows block a switch to WAL.
	w := outbox.Writer{Schema: b.schema}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := w.WriteTx(ctx, tx, outbox.Record{Topic: "t", Value: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.SetMode(ctx, b.pool, b.schema, outbox.ModeWAL); err == nil || !strings.Contains(err.Error(), "pending rows") {
		t.Fatalf("switch with a pending row: %v, want a refusal naming the pending rows", err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.t.Outbox); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = outbox.DropSlot(context.Background(), b.pool, b.schema, true)
		_, _ = b.pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{outbox.PublicationName(b.schema)}.Sanitize())
	})
	mode, err := outbox.EnsureMode(ctx, b.pool, b.schema, outbox.ModeWAL)
	if err != nil || mode != outbox.ModeWAL {
		t.Fatalf("EnsureMode(wal) on a schema never chosen: %v, %v", mode, err)
	}
	s, _ = outbox.ReadSettings(ctx, b.pool, b.schema)
	var slotOK bool
	if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND plugin = 'pgoutput')`, s.Slot).Scan(&slotOK); err != nil || !slotOK {
		t.Fatalf("slot %q after EnsureMode(wal): exists %v, %v", s.Slot, slotOK, err)
	}
	if _, err := outbox.EnsureMode(ctx, b.pool, b.schema, outbox.ModeTable); !errors.Is(err, outbox.ErrModeConflict) {
		t.Fatalf("EnsureMode(table) on a schema chosen wal: %v, want ErrModeConflict", err)
	}
	var ids []int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = w.WriteTx(ctx, tx, walRecords()...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || !(ids[0] < ids[1] && ids[1] < ids[2]) {
		t.Fatalf("WAL-mode ids %v: want 3 ascending positions", ids)
	}
	var rows int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("WAL-mode WriteTx stored %d rows (%v), want none", rows, err)
	}
	if _, err := outbox.DropSlot(ctx, b.pool, b.schema, false); err == nil {
		t.Fatal("DropSlot without force in WAL mode: no error")
	}
	if _, err := outbox.DropSlot(ctx, b.pool, b.schema, true); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, walRecords()...); return err })
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "KX002" {
		t.Fatalf("write with the slot dropped: %v, want SQLSTATE KX002", err)
	}
	if _, err := outbox.EnsureMode(ctx, b.pool, b.schema, ""); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("EnsureMode with the slot missing: %v, want an error naming it", err)
	}
}
