package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A dead letter published to its dead-letter topic and lost with the database's last
// transactions (a failover to a standby that did not have them) is written again when the
// message is re-processed: it must go out under the same kafkatx-outbox-id, so a consumer of
// the dead-letter topic deduplicating by it sees it once; a new replay epoch gives a new id.
func TestDeadLetterWrittenAgainKeepsItsOutboxID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	write := func(epoch int, keep bool) string {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		d := &dlq.DeadLetter{Group: "g", Topic: "orders", Partition: 2, Offset: 41, Key: []byte("k"), Value: []byte("v"),
			ErrorClass: engine.ClassPermanent, ErrorMessage: "bad", Attempts: 1, FirstFailureAt: now, LastFailureAt: now, ReplayEpoch: epoch}
		if err := engine.WriteDeadLetter(ctx, tx, schema, d, "orders.dlq"); err != nil {
			t.Fatal(err)
		}
		var id string
		if err := tx.QueryRow(ctx, "SELECT outbox_id::text FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()+" WHERE topic = 'orders.dlq'").Scan(&id); err != nil {
			t.Fatal(err)
		}
		if keep {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	lost := write(0, false) // the transaction a failover took away
	again := write(0, true)
	if lost != again {
		t.Fatalf("the dead letter written again went out under %s, the lost one under %s: a consumer deduplicating by kafkatx-outbox-id sees it twice", again, lost)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if replayed := write(1, false); replayed == again {
		t.Fatalf("a new replay epoch kept the id %s: an operator's replay would be dropped as a copy", replayed)
	}
}
