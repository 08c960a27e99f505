package kafkatx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestCommitWaitingForTheStandbyIsNeverCancelled: statement_timeout also times COMMIT, and a
// COMMIT waiting for a synchronous standby that is cancelled leaves its transaction committed
// and visible on the primary while no standby has it (PostgreSQL: "canceling wait for
// synchronous replication"; a failover then loses a commit the consumer saw succeed). On a
// PostgreSQL of the test's own whose synchronous standby never answers, with a
// statement_timeout of 300 ms, the loop's COMMIT goes on waiting for 10 timeouts and nothing
// of it is visible; once the standby requirement is lifted it commits, every message once.
func TestCommitWaitingForTheStandbyIsNeverCancelled(t *testing.T) {
	t.Parallel()
	own := testenv.StartOwnPostgres(t, "synchronous_commit = on")
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, own.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	b := &testBundle{pool: admin, dbURL: own.URL, schema: "kafkatx", brokers: testenv.Brokers(t)}
	b.topic = testenv.Topic(t, b.brokers, 1)
	b.group = "g-" + b.topic
	b.migrateWithEffects(t)
	for _, sql := range []string{"ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	produce(t, b.brokers, b.topic, values(3, 0, func(i int) string { return fmt.Sprint(i) }))
	cfg := b.config(t)
	cfg.Transaction.StatementTimeout = 300 * time.Millisecond
	b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	waitFor(t, 60*time.Second, "a COMMIT waiting for the standby", func() bool {
		var pid int
		return admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' LIMIT 1`).Scan(&pid) == nil
	})
	time.Sleep(3 * time.Second) // 10 statement timeouts
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects"); n != 0 {
		t.Fatalf("%d effects visible while no standby has them: the COMMIT's wait for the standby was cancelled", n)
	}
	var waiting int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&waiting); err != nil || waiting == 0 {
		t.Fatalf("no COMMIT waits for the standby any more (%v)", err)
	}
	for _, sql := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "every message applied", func() bool { return b.q(t, "SELECT count(*) FROM kafkatx.effects") == 3 })
	if n := b.q(t, "SELECT count(*) FROM kafkatx.effects WHERE applied <> 1") + b.q(t, "SELECT count(*) FROM kafkatx.dead_letters"); n != 0 {
		t.Fatalf("%d effects applied twice or dead letters", n)
	}
}
