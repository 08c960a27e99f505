package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/retention"
)

// TestCleanDeletesWhatIsPastItsRetentionOnly stages, for each table, a row past its retention
// and one within it (or still open), runs one pass, and checks that exactly the old resolved
// rows went: an open dead letter of any age stays, a resolved one of 2 days goes with 1h
// retention, an attempt row of 9 days goes, one of a minute stays, an expired idempotency key
// goes, a live one stays; the outbox rows only with WithOutbox.
func TestCleanDeletesWhatIsPastItsRetentionOnly(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	id := func(tb string) string { return pgx.Identifier{schema, tb}.Sanitize() }
	for _, sql := range []string{
		`INSERT INTO ` + id("dead_letters") + ` (group_id, topic, partition, "offset", value, error_class, error_message, attempts, first_failure_at, last_failure_at, status, resolved_at)
			VALUES ('g','t',0,1,'x','permanent','bad',1, now() - interval '3 days', now() - interval '3 days', 'discarded', now() - interval '2 days'),
			       ('g','t',0,2,'y','permanent','bad',1, now() - interval '90 days', now() - interval '90 days', 'new', NULL),
			       ('g','t',0,3,'z','permanent','bad',1, now(), now(), 'replayed', now())`,
		`INSERT INTO ` + id("attempts") + ` (group_id, topic, partition, "offset", attempts, updated_at)
			VALUES ('g','t',0,4,1, now() - interval '9 days'), ('g','t',0,5,1, now() - interval '1 minute')`,
		`INSERT INTO ` + id("idempotency_keys") + ` (scope, key, expires_at) VALUES ('g', 'old', now() - interval '1 second'), ('g', 'live', now() + interval '1 hour')`,
		`INSERT INTO ` + id("airflow_ledger") + ` (group_id, topic, partition, "offset", idempotency_key, target, dag_id, run_id, outcome, created_at)
			VALUES ('g','t',0,6,'k6','dag_run','d','r6','created', now() - interval '2 hours'), ('g','t',0,7,'k7','dag_run','d','r7','created', now())`,
		`INSERT INTO ` + id("airflow_pending") + ` (kafkatx_id, group_id, asset_name, sent_at) VALUES ('old','g','a', now() - interval '2 hours'), ('live','g','a', now())`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	count := func(tb, where string) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+id(tb)+` WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	got, err := retention.New(pool, schema, retention.Config{AttemptsRetention: time.Hour, DeadLetterRetention: time.Hour, AirflowLedgerRetention: time.Hour, BatchSize: 1}, nil).Clean(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got["dead_letters"] != 1 || got["attempts"] != 1 || got["idempotency_keys"] != 1 || got["airflow_ledger"] != 1 || got["airflow_pending"] != 1 {
		t.Errorf("deleted %v, want 1 dead letter, 1 attempt row, 1 idempotency key, 1 Airflow ledger row, 1 pending mark", got)
	}
	for _, c := range []struct {
		table, where string
		want         int
	}{
		{"dead_letters", `status = 'new'`, 1}, {"dead_letters", `status = 'discarded'`, 0}, {"dead_letters", `status = 'replayed'`, 1},
		{"attempts", `true`, 1}, {"idempotency_keys", `key = 'live'`, 1}, {"idempotency_keys", `key = 'old'`, 0},
		{"airflow_ledger", `run_id = 'r7'`, 1}, {"airflow_ledger", `run_id = 'r6'`, 0}, {"airflow_pending", `kafkatx_id = 'live'`, 1},
	} {
		if n := count(c.table, c.where); n != c.want {
			t.Errorf("%s where %s: %d rows left, want %d", c.table, c.where, n, c.want)
		}
	}
	// Negative retention keeps rows forever.
	if _, err := pool.Exec(ctx, `UPDATE `+id("attempts")+` SET updated_at = now() - interval '30 days'`); err != nil {
		t.Fatal(err)
	}
	if _, err := retention.New(pool, schema, retention.Config{AttemptsRetention: -1}, nil).Clean(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count("attempts", "true"); n != 1 {
		t.Errorf("AttemptsRetention -1 deleted the attempt row (%d left)", n)
	}
}
