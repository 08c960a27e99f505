package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Issue 46: kafkatx migrate up --outbox-mode wal with --shard sets WAL mode, and creates the
// slot, on every shard and not on the directory's database when it is not a shard: a slot
// there, which no relay streams, only retained the directory cluster's WAL.
func TestMigrateUpWALModeOnShardsOnly(t *testing.T) {
	bin := buildCLI(t)
	ctx := context.Background()
	urls := map[string]string{"dir": testenv.Database(t), "s1": testenv.Database(t), "s2": testenv.Database(t)}
	pools := map[string]*pgxpool.Pool{}
	for name, u := range urls {
		p, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = p.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
			p.Close()
		})
		pools[name] = p
	}
	out, errOut, code := runCLI(t, bin, "--database-url", urls["dir"], "--shard", "s1="+urls["s1"], "--shard", "s2="+urls["s2"],
		"migrate", "up", "--outbox-mode", "wal")
	if code != 0 {
		t.Fatalf("migrate up: exit %d\n%s%s", code, out, errOut)
	}
	for name, p := range pools {
		st, err := outbox.ReadSettings(ctx, p, "")
		if err != nil {
			t.Fatal(err)
		}
		var slots int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&slots); err != nil {
			t.Fatal(err)
		}
		want, wantSlots := outbox.ModeWAL, 1
		if name == "dir" {
			want, wantSlots = outbox.ModeTable, 0
		}
		if st.Mode != want || slots != wantSlots {
			t.Errorf("%s: outbox mode %s with %d slots; want %s with %d", name, st.Mode, slots, want, wantSlots)
		}
	}
	if !strings.Contains(out, "shard s1: outbox mode wal") || !strings.Contains(out, "shard s2: outbox mode wal") || strings.Contains(strings.ReplaceAll(out, "shard s", ""), "\noutbox mode") {
		t.Errorf("migrate up printed:\n%s", out)
	}
}
