package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue 48 (F2): switching a WAL outbox to table mode with records still in its slot lost
// them silently, and drop-slot then dropped it without a word. With an unpublished outbox
// record in the slot, SetMode(table) and DropSlot refuse (ErrSlotHoldsRecords); a slot that
// lags only on other WAL (another prefix's message, another table's rows) is not refused;
// SetModeForce and DropSlot(force) go on.
func TestSwitchToTableRefusesASlotHoldingRecords(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const schema = "drain48"
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := outbox.SetMode(ctx, pool, schema, outbox.ModeWAL); err != nil {
		t.Fatal(err)
	}
	defer outbox.DropSlot(context.Background(), pool, schema, true)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Lag on other WAL only: another schema's message and a table's rows.
	exec(`SELECT pg_logical_emit_message(true, $1, 'x'::bytea)`, outbox.WALPrefix("another"))
	exec(`CREATE TABLE IF NOT EXISTS drain48_filler (g int)`)
	exec(`INSERT INTO drain48_filler SELECT generate_series(1, 100)`)
	if err := outbox.SetMode(ctx, pool, schema, outbox.ModeTable); err != nil {
		t.Fatalf("switch with a slot lagging only on other WAL: %v, want nil", err)
	}
	if err := outbox.SetMode(ctx, pool, schema, outbox.ModeWAL); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT pg_logical_emit_message(true, $1, 'x'::bytea)`, outbox.WALPrefix(schema))
	err = outbox.SetMode(ctx, pool, schema, outbox.ModeTable)
	if !errors.Is(err, outbox.ErrSlotHoldsRecords) {
		t.Fatalf("switch to table with a record in the slot: %v, want ErrSlotHoldsRecords", err)
	}
	if st, _ := outbox.ReadSettings(ctx, pool, schema); st.Mode != outbox.ModeWAL {
		t.Fatalf("refused switch left mode %s", st.Mode)
	}
	if err := outbox.SetModeForce(ctx, pool, schema, outbox.ModeTable); err != nil {
		t.Fatalf("SetModeForce: %v", err)
	}
	if _, err := outbox.DropSlot(ctx, pool, schema, false); !errors.Is(err, outbox.ErrSlotHoldsRecords) {
		t.Fatalf("drop-slot with a record in the slot: %v, want ErrSlotHoldsRecords", err)
	}
	if _, err := outbox.DropSlot(ctx, pool, schema, true); err != nil {
		t.Fatalf("drop-slot --force: %v", err)
	}
}
