package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// When no outbox message flows, the slot still moves past other WAL (the relay confirms the
// walsender's position from its keepalives), so an idle slot does not pin WAL.
func TestIdleSlotAdvancesPastOtherWAL(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	r, _, _ := b.start(t, b.config(t))
	waitStreaming(t, r)
	ctx := context.Background()
	for _, q := range []string{`CREATE TABLE other_work (g int, pad text)`,
		`INSERT INTO other_work SELECT g, repeat('x', 100) FROM generate_series(1, 50000) g`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var after pglogrepl.LSN
	if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	var confirmed pglogrepl.LSN
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		// Pending asks the server for a keepalive, as --exit-when-idle does; without it the
		// walsender's own keepalives (wal_sender_timeout / 2) move the slot too, later.
		if _, err := r.Pending(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
		if confirmed >= after {
			return
		}
	}
	t.Fatalf("slot confirmed %s, still before %s (other WAL written while idle) after 30 s", confirmed, after)
}
