package walrelay

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A slot retaining more than half of what max_slot_wal_keep_size allows is warned about, with
// the figures, and its metrics' source (Health) reports them, before PostgreSQL invalidates
// it. Own cluster (the setting is cluster-wide).
func TestSlotNearMaxSlotWALKeepSizeIsWarnedAbout(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "max_slot_wal_keep_size = 96MB\nmax_wal_size = 256MB")
	b := newBundleOn(t, brokers, o.URL)
	ctx := context.Background()
	// About 75 MB of WAL the slot must keep: no relay confirms it.
	for _, q := range []string{`CREATE TABLE filler (g int, pad text)`,
		`INSERT INTO filler SELECT g, repeat('x', 300) FROM generate_series(1, 200000) g`, `CHECKPOINT`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zap.WarnLevel)
	cfg := b.config(t)
	cfg.Logger, cfg.StatusInterval = zap.New(core), 50*time.Millisecond
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The watch runs until the slot's figures are in Health — a condition, not a 2 s window a
	// loaded machine may fill with no check at all — and a second more of checks (every 50 ms,
	// for "warned once while over"), then stops.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan error, 1)
	go func() { watched <- r.watchSlot(wctx, b.slot) }()
	testenv.WaitFor(t, 60*time.Second, "the slot's figures in Health", func() bool { return r.Health().RetainedBytes >= 48<<20 })
	time.Sleep(time.Second)
	cancel()
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	h := r.Health()
	if h.RetainedBytes < 48<<20 || h.SafeBytes < 0 || h.WALStatus == "lost" {
		t.Fatalf("slot health %+v: want about 75 MB retained, a safe size, not lost", h)
	}
	warned := logs.FilterMessageSnippet("max_slot_wal_keep_size").All()
	if len(warned) != 1 {
		t.Fatalf("%d warnings about max_slot_wal_keep_size over its checks (want exactly one: warned once while over); health %+v", len(warned), h)
	}
}
