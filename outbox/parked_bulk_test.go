package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// parkRows writes n keyed rows to topic and parks them as the relay would (state parked,
// parked_at, last_error), returning their ids.
func (b *testBundle) parkRows(t *testing.T, topic string, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	recs := make([]outbox.Record, n)
	for i := range recs {
		recs[i] = outbox.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%50), Value: fmt.Appendf(nil, "v%d", i)}
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if ids, err = (outbox.Writer{Schema: b.schema}).WriteTx(ctx, tx, recs...); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+b.t.Outbox+` SET state = 'parked', parked_at = now(), attempts = 1,
			last_error = 'Broker: Message size too large' WHERE id = ANY($1)`, ids)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Issue "a user's first week" 3: 7,980 parked rows took 7,980 `outbox release` calls (287 s).
// One call now releases every parked row of a topic in one statement, each audited, and
// leaves the other topic's rows and a row parked after the dry run alone.
func TestReleaseAllReleasesFiveThousandParkedRowsInOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	audit := pgx.Identifier{b.schema, "outbox_audit"}.Sanitize()
	big := b.parkRows(t, "orders-events", 5000)
	other := b.parkRows(t, "audit-events", 7)

	sum, err := w.ParkedSummary(ctx, b.pool, outbox.ParkedSelection{Topic: "orders-events"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum) != 1 || sum[0].Rows != 5000 || sum[0].FirstID != big[0] || sum[0].LastID != big[len(big)-1] {
		t.Fatalf("dry run %+v, want 5000 rows %d..%d", sum, big[0], big[len(big)-1])
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.t.Outbox+` WHERE state = 'parked'`); n != 5007 {
		t.Fatalf("the dry run changed rows: %d parked, want 5007", n)
	}
	// A row of the topic parked after the dry run is not covered by its bound.
	late := b.parkRows(t, "orders-events", 1)

	start := time.Now()
	var released int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		released, err = w.ReleaseAllTx(ctx, tx, outbox.ParkedSelection{Topic: "orders-events", MaxID: outbox.MaxIDOf(sum)}, "topic limit raised", "ops@host")
		return err
	})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %d parked rows in one statement in %v", released, took)
	if released != 5000 {
		t.Fatalf("released %d, want 5000", released)
	}
	if took > 15*time.Second {
		t.Fatalf("releasing 5,000 rows took %v, want well under 15 s", took)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.t.Outbox+` WHERE id = ANY($1) AND state = 'pending' AND parked_at IS NULL`, big); n != 5000 {
		t.Fatalf("%d of 5000 rows pending", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+audit+` WHERE outbox_row = ANY($1) AND action = 'release' AND reason = 'topic limit raised'
		AND actor = 'ops@host' AND parked_error = 'Broker: Message size too large'`, big); n != 5000 {
		t.Fatalf("%d audit rows, want one per released row", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.t.Outbox+` WHERE id = ANY($1) AND state = 'parked'`, append(other, late...)); n != 8 {
		t.Fatalf("%d of the 8 rows outside the selection still parked", n)
	}

	// Discard the rest of every topic; a second call finds nothing and is not an error.
	var discarded, again int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if discarded, err = w.DiscardAllTx(ctx, tx, outbox.ParkedSelection{}, "obsolete", "ops@host"); err != nil {
			return err
		}
		again, err = w.DiscardAllTx(ctx, tx, outbox.ParkedSelection{}, "obsolete", "ops@host")
		return err
	})
	if err != nil || discarded != 8 || again != 0 {
		t.Fatalf("discard all: %d then %d, %v; want 8 then 0", discarded, again, err)
	}
	if n := b.count(t, `SELECT count(*) FROM `+audit+` WHERE action = 'discard'`); n != 8 {
		t.Fatalf("%d discard audit rows, want 8", n)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := w.ReleaseAllTx(ctx, tx, outbox.ParkedSelection{}, "", "ops@host")
		return err
	})
	if !errors.Is(err, outbox.ErrNoReason) {
		t.Fatalf("release without a reason: %v, want ErrNoReason", err)
	}
}
