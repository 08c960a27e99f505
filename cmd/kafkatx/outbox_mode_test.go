package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The outbox mode is stored with the schema: `migrate up --outbox-mode wal` sets it (slot and
// publication created), `relay --outbox-mode table` then exits 2 with one line naming both
// modes, `outbox drop-slot` refuses without --force in WAL mode and drops the slot with it.
func TestOutboxModeFlagsConflictsAndDropSlot(t *testing.T) {
	bin := buildCLI(t)
	dsn := testenv.Database(t)
	brokers := testenv.Brokers(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		pool.Close()
	})
	out, stderr, code := runCLI(t, bin, "--database-url", dsn, "migrate", "up", "--outbox-mode", "wal")
	if code != 0 || !strings.Contains(out, "outbox mode wal (slot kafkatx_") {
		t.Fatalf("migrate up --outbox-mode wal: exit %d, %q %q", code, out, stderr)
	}
	_, stderr, code = runCLI(t, bin, "--database-url", dsn, "--brokers", brokers, "relay", "--outbox-mode", "table")
	if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "conflicts") || !strings.Contains(stderr, "wal") {
		t.Fatalf("relay --outbox-mode table on a WAL schema: exit %d, stderr %q; want 2 and one line naming the stored mode", code, stderr)
	}
	// Issue 31: a table-mode flag means nothing in WAL mode: refused (2, one line naming it)
	// once the schema's mode is read, never accepted and ignored; retention flags apply.
	for _, flag := range tableOnlyFlags {
		val := "1s"
		if flag == "batch-size" {
			val = "10"
		}
		args := []string{"--database-url", dsn, "--brokers", brokers, "relay", "--" + flag + "=" + val, "--exit-when-idle", "1s"}
		if flag == "keep-published" {
			args = append(args[:len(args)-2], "--keep-published=0s", "--exit-when-idle", "1s") // even its default, given
		}
		out, stderr, code := runCLI(t, bin, args...)
		if code != 2 || out != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "--"+flag) {
			t.Errorf("relay --%s in WAL mode: exit %d, stdout %q, stderr %q; want 2 and one line naming it", flag, code, out, stderr)
		}
	}
	out, stderr, code = runCLI(t, bin, "--database-url", dsn, "--brokers", brokers, "relay", "--attempts-retention", "2h", "--dead-letter-retention", "2h", "--exit-when-idle", "1s")
	if code != 0 || !strings.Contains(out, `"transactions"`) {
		t.Fatalf("relay with retention flags in WAL mode: exit %d, %q %q; want 0", code, out, tailString(stderr, 300))
	}
	_, stderr, code = runCLI(t, bin, "--database-url", dsn, "outbox", "drop-slot")
	if code == 0 || !strings.Contains(stderr, "--force") {
		t.Fatalf("drop-slot in WAL mode without --force: exit %d, %q", code, stderr)
	}
	out, stderr, code = runCLI(t, bin, "--database-url", dsn, "outbox", "drop-slot", "--force")
	if code != 0 || !strings.Contains(out, "dropped replication slot") {
		t.Fatalf("drop-slot --force: exit %d, %q %q", code, out, stderr)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d slots left after drop-slot (%v)", n, err)
	}
}
