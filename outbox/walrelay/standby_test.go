package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Logical decoding sends a transaction once its commit is flushed on the primary, before a
// synchronous standby has it: on a PostgreSQL of the test's own whose synchronous standby
// never answers, a writer's COMMIT waits, and the relay, which has decoded the transaction,
// publishes nothing of it for 3 s (published, it would be a ghost after a failover to the
// standby). Once the requirement is lifted, the writer's COMMIT returns and the records are
// published once.
func TestNothingIsPublishedBeforeTheSynchronousStandbyHasIt(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "synchronous_commit = on")
	b := newBundleOn(t, brokers, o.URL)
	ctx := context.Background()
	b.start(t, b.config(t))
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'", "SELECT pg_reload_conf()"} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	written := make(chan struct{})
	go func() { defer close(written); b.write(t, "waiting", 5, 5) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var waiting int64
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query NOT LIKE '%kafkatx.standby-wait%'`).Scan(&waiting)
		if err == nil && waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer's COMMIT does not wait for the standby within 30 s (%v): the test proves nothing", err)
		}
	}
	time.Sleep(3 * time.Second) // the relay decoded the transaction long ago
	if got := readAll(t, b.brokers, b.topic, 0, 5*time.Second, 10*time.Second); len(got) != 0 {
		t.Fatalf("%d records published while no synchronous standby has their transaction", len(got))
	}
	for _, q := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	<-written
	onceEach(t, readAll(t, b.brokers, b.topic, 5, time.Second, 30*time.Second), values("waiting", 5))
}
