package walrelay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A crash of PostgreSQL (immediate stop, no shutdown checkpoint) while the relay streams: the
// slot resends from as far back as its last checkpoint, the relay reconnects and skips what its
// Kafka checkpoint covers; a read_committed reader sees each record once. Own cluster.
func TestPostgresCrashPublishesEachRecordOnce(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "")
	b := newBundleOn(t, brokers, o.URL)
	r, _, _ := b.start(t, b.config(t))
	for i := 0; i < 10; i++ {
		b.write(t, "a"+string(rune('0'+i)), 100, 7)
	}
	for end := time.Now().Add(30 * time.Second); r.Stats().Published < 500 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
	}
	o.Restart(t, "immediate")
	b.pool.Reset()
	for i := 0; i < 10; i++ {
		b.write(t, "b"+string(rune('0'+i)), 100, 7)
	}
	var want []string
	for i := 0; i < 10; i++ {
		want = append(want, values("a"+string(rune('0'+i)), 100)...)
	}
	for i := 0; i < 10; i++ {
		want = append(want, values("b"+string(rune('0'+i)), 100)...)
	}
	onceEach(t, readAll(t, b.brokers, b.topic, len(want), 3*time.Second, 90*time.Second), want)
}

// A slot invalidated by max_slot_wal_keep_size (wal_status lost) stops the relay with a
// FatalError saying what was lost and how to recover, instead of streaming on. Own cluster.
func TestSlotInvalidatedByMaxSlotWALKeepSizeIsFatal(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "max_slot_wal_keep_size = 1MB\nmax_wal_size = 64MB\nmin_wal_size = 32MB")
	b := newBundleOn(t, brokers, o.URL)
	b.write(t, "before", 5, 5)
	ctx := context.Background()
	var status string
	for i := 0; i < 6 && status != "lost"; i++ {
		for _, q := range []string{`CREATE TABLE IF NOT EXISTS filler (g int, pad text)`,
			`INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, 100000) g`,
			`SELECT pg_switch_wal()`, `CHECKPOINT`} {
			if _, err := b.pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	if status != "lost" {
		t.Fatalf("slot wal_status %q after filling WAL past max_slot_wal_keep_size, want lost", status)
	}
	_, _, done := b.start(t, b.config(t))
	select {
	case err := <-done:
		var fe *FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "invalidated") || !strings.Contains(err.Error(), "lost") || !strings.Contains(err.Error(), "Recover") {
			t.Fatalf("relay ended with %v, want a FatalError saying the slot was invalidated, what is lost and how to recover", err)
		}
		done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("the relay runs on an invalidated slot")
	}
}

// A transaction larger than logical_decoding_work_mem (64 kB for the relay's walsender: a
// setting of its session, not the cluster's) spills to disk on the server and is published
// whole, once.
func TestTransactionSpillingPastLogicalDecodingWorkMem(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	cfg := b.config(t)
	repl := b.pool.Config().ConnConfig.Copy()
	repl.RuntimeParams["logical_decoding_work_mem"] = "64kB"
	cfg.Replication = repl
	b.write(t, "spill", 20000, 100)
	b.start(t, cfg)
	onceEach(t, readAll(t, b.brokers, b.topic, 20000, 2*time.Second, 90*time.Second), values("spill", 20000))
	var spilled int64
	if err := b.pool.QueryRow(context.Background(), `SELECT spill_txns FROM pg_stat_replication_slots WHERE slot_name = $1`, b.slot).Scan(&spilled); err != nil {
		t.Fatal(err)
	}
	if spilled < 1 {
		t.Fatalf("pg_stat_replication_slots.spill_txns = %d: the transaction did not spill, the test proves nothing", spilled)
	}
}

// Issue "outages" 6: a slot whose WAL was removed on the server — the segment of its
// restart_lsn deleted from pg_wal, so wal_status still reads reserved while the stream fails
// with 58P01 — stopped the relay with the recovery, yet kafkatx_walrelay_slot_ready read 1.
// It reads 0 (and Health().Ready() is false) for a slot the relay cannot stream. Own cluster.
func TestSlotReadyReadsZeroForASlotWhoseWALWasRemoved(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "")
	b := newBundleOn(t, brokers, o.URL)
	b.write(t, "before", 5, 5)
	ctx := context.Background()
	var seg string
	if err := b.pool.QueryRow(ctx, `SELECT pg_walfile_name(restart_lsn) FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&seg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // the current segment moves past the slot's
		b.write(t, "more", 5, 5)
		if _, err := b.pool.Exec(ctx, `SELECT pg_switch_wal()`); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(o.DataDir(), "pg_wal", seg)); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&status); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := b.config(t)
	cfg.Registerer = reg
	r, _, done := b.start(t, cfg)
	select {
	case err := <-done:
		var fe *FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "cannot be streamed") {
			t.Fatalf("relay ended with %v, want the FatalError of a slot that cannot be streamed", err)
		}
		done <- nil
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not stop on a slot whose WAL was removed")
	}
	if r.Health().Ready() {
		t.Errorf("Health().Ready() is true for a slot the relay cannot stream (wal_status %s)", status)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kafkatx_walrelay_slot_ready" {
			found = true
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 0 {
				t.Errorf("kafkatx_walrelay_slot_ready = %v for a slot whose WAL was removed (wal_status %s), want 0", v, status)
			}
		}
	}
	if !found {
		t.Fatal("no kafkatx_walrelay_slot_ready metric")
	}
}
