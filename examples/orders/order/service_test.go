package order

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// TestHandleBatchRefusesACustomerTotalPastBigint applies 100 maximal orders of one customer in
// one batch: the order that would take the running total past int64 fails alone, as a
// permanent error, instead of wrapping around.
func TestHandleBatchRefusesACustomerTotalPastBigint(t *testing.T) {
	ctx := context.Background()
	pool := migrated(t)
	var msgs []*kafkatx.Message
	for i := range 100 {
		v := fmt.Sprintf(`{"order_id":"W-%d","customer":"whale","item":"w","quantity":1000000,"price":999999999.99}`, i)
		msgs = append(msgs, &kafkatx.Message{Offset: int64(i), Value: []byte(v)})
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = (&Service{}).HandleBatch(ctx, tx, msgs)
	var me *kafkatx.MessageError
	if !errors.As(err, &me) || !kafkatx.IsPermanent(err) || me.Offset != 92 {
		t.Fatalf("HandleBatch = %v, want a permanent failure of offset 92 (the first order past the bigint range)", err)
	}
}

// TestHandleBatchAppliesTheFirstOfTwoMessagesWithOneOrderID: within one batch the first
// message of an order id is the one applied, and its event and counter carry its values.
func TestHandleBatchAppliesTheFirstOfTwoMessagesWithOneOrderID(t *testing.T) {
	ctx := context.Background()
	pool := migrated(t)
	var msgs []*kafkatx.Message
	for i, v := range []string{
		`{"order_id":"D-1","customer":"first","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"D-2","customer":"other","item":"w","quantity":1,"price":5.00}`,
		`{"order_id":"D-1","customer":"second","item":"w","quantity":3,"price":2.00}`,
	} {
		msgs = append(msgs, &kafkatx.Message{Offset: int64(i), Value: []byte(v)})
	}
	var events []outbox.Record
	svc := &Service{EventsTopic: "order-events", WriteEvents: func(_ context.Context, _ pgx.Tx, recs ...outbox.Record) ([]int64, error) {
		events = append(events, recs...)
		return make([]int64, len(recs)), nil
	}}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := svc.HandleBatch(ctx, tx, msgs); err != nil {
		t.Fatal(err)
	}
	var customer string
	var cents int64
	if err := tx.QueryRow(ctx, `SELECT customer, total_cents FROM order_totals WHERE order_id = 'D-1'`).Scan(&customer, &cents); err != nil || customer != "first" || cents != 100 {
		t.Fatalf("order D-1 = %s %d (%v), want the first message's: first 100", customer, cents, err)
	}
	var counted int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(orders), 0) FROM customer_totals WHERE customer = 'second'`).Scan(&counted); err != nil || counted != 0 {
		t.Fatalf("customer second counted %d orders (%v), want 0", counted, err)
	}
	got := map[string]string{}
	for _, e := range events {
		got[string(e.Key)] = string(e.Value)
	}
	if len(events) != 2 || got["D-1"] != `{"order_id":"D-1","customer":"first","total_cents":100}` {
		t.Fatalf("events %v, want one per order id, D-1 with the first message's values", got)
	}
}

// migrated returns a pool on a fresh database with the service's tables.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}
