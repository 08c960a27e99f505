package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// SlotName is one to one: names that read alike once made an identifier get different
// slots, each at most 63 bytes of [a-z0-9_], the same for the same names.
func TestSlotNameKeepsNamesThatReadAlikeApart(t *testing.T) {
	seen := map[string][2]string{}
	for _, c := range [][2]string{
		{"db", "tenant_a"}, {"db", "tenant-a"}, {"db", "Tenant_A"}, {"db", `x"y`},
		{"a_b", "c"}, {"a", "b_c"}, {"atk-1", "kafkatx"}, {"atk_1", "kafkatx"},
		{strings.Repeat("d", 63), strings.Repeat("s", 63)}, {strings.Repeat("d", 63), strings.Repeat("s", 62) + "t"},
	} {
		s := outbox.SlotName(c[0], c[1])
		if s != outbox.SlotName(c[0], c[1]) {
			t.Fatalf("SlotName(%q, %q) is not deterministic", c[0], c[1])
		}
		if len(s) > 63 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			t.Fatalf("SlotName(%q, %q) = %q: not an identifier of at most 63 bytes of [a-z0-9_]", c[0], c[1], s)
		}
		if prev, ok := seen[s]; ok {
			t.Fatalf("SlotName(%q, %q) = SlotName(%q, %q) = %q", c[0], c[1], prev[0], prev[1], s)
		}
		seen[s] = c
	}
}

// A slot another schema of the database records as its own, or one of another database, is
// refused at set-up (migrate up --outbox-mode wal) instead of shared: a schema set up before
// the names were one to one may hold a name another one would now be given.
func TestSetModeRefusesAnotherOutboxsSlot(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, s := range []string{"first", "second"} {
		if _, err := migrations.Apply(ctx, pool, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := outbox.SetMode(ctx, pool, "first", outbox.ModeWAL); err != nil {
		t.Fatal(err)
	}
	st, err := outbox.ReadSettings(ctx, pool, "first")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, st.Slot)
	})
	// "second" records the same slot name, as two schemas of the old rule did.
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{"second", "outbox_settings"}.Sanitize()+` SET slot_name = $1`, st.Slot); err != nil {
		t.Fatal(err)
	}
	err = outbox.SetMode(ctx, pool, "second", outbox.ModeWAL)
	if err == nil || !strings.Contains(err.Error(), "schema first's") {
		t.Fatalf("SetMode of a schema recording another schema's slot: %v; want a refusal naming schema first", err)
	}
	if s2, _ := outbox.ReadSettings(ctx, pool, "second"); s2.Mode == outbox.ModeWAL {
		t.Fatal("the refused schema was switched to WAL mode")
	}

	// Another database whose schema records this slot's name.
	other, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := migrations.Apply(ctx, other, "kafkatx"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `UPDATE kafkatx.outbox_settings SET slot_name = $1`, st.Slot); err != nil {
		t.Fatal(err)
	}
	err = outbox.SetMode(ctx, other, "kafkatx", outbox.ModeWAL)
	if err == nil || !strings.Contains(err.Error(), "already exists for database") {
		t.Fatalf("SetMode with another database's slot: %v; want a refusal naming the database", err)
	}
}

// A slot declared ahead of the set-up under the name the rule before the hash gave
// ("kafkatx_<database>_<schema>": a Patroni permanent slot, as docs/outbox-wal.md and
// scripts/dev-services up patroni declare it) is taken with its publication, not left to pin
// WAL beside a new one; a second schema whose names read alike gets its own.
func TestSetModeTakesOldNamedSlot(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Database(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	old := strings.ToLower("kafkatx_" + db + "_kafkatx")
	if len(old) > 63 {
		t.Fatalf("test database name %s too long for the old rule's plain form", db)
	}
	if _, err := pool.Exec(ctx, `CREATE PUBLICATION kafkatx_outbox_kafkatx`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, old); err != nil {
		t.Fatal(err)
	}
	var slots []string
	t.Cleanup(func() {
		for _, s := range append(slots, old) {
			_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, s)
		}
	})
	for _, s := range []string{"kafkatx", "KafkaTX"} {
		if _, err := migrations.Apply(ctx, pool, s); err != nil {
			t.Fatal(err)
		}
		if err := outbox.SetMode(ctx, pool, s, outbox.ModeWAL); err != nil {
			t.Fatalf("schema %s: %v", s, err)
		}
		st, err := outbox.ReadSettings(ctx, pool, s)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, st.Slot)
	}
	if slots[0] != old {
		t.Fatalf("schema kafkatx took slot %s, want the one declared ahead, %s", slots[0], old)
	}
	if slots[1] == old || slots[1] != outbox.SlotName(db, "KafkaTX") {
		t.Fatalf("schema KafkaTX took slot %s, want its own (%s)", slots[1], outbox.SlotName(db, "KafkaTX"))
	}
}
