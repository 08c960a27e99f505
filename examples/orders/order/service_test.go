package order

import (
	"context"
	"fmt"
	"testing"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// TestHandleBatchRefusesACustomerTotalPastBigint applies 100 maximal orders of one customer in
// one batch, the way the loop runs it: the order that would take the running total past int64
// fails alone, as a permanent error naming its message, instead of wrapping around; the orders
// before it commit, and each later one, which can only pass the range too, is dead-lettered.
func TestHandleBatchRefusesACustomerTotalPastBigint(t *testing.T) {
	k := migrated(t)
	var msgs []*kafkatx.Message
	for i := range 100 {
		v := fmt.Sprintf(`{"order_id":"W-%d","customer":"whale","item":"w","quantity":1000000,"price":999999999.99}`, i)
		msgs = append(msgs, kafkatxtest.NewMessage("orders", 0, int64(i), nil, []byte(v)))
	}
	tx := k.RunBatch((&Service{}).HandleBatch, msgs...)
	for _, o := range tx.Outcomes() {
		want := kafkatxtest.Committed
		if o.Message.Offset >= 92 {
			want = kafkatxtest.DeadLettered
		}
		if o.Kind != want || (want == kafkatxtest.DeadLettered && o.ErrorClass != kafkatx.ErrorClassPermanent) {
			t.Fatalf("%v; want %v (permanent) from offset 92, the first order past the bigint range", o, want)
		}
	}
	if o := tx.Outcome(92); o.ErrorMessage != "customer whale: total would pass the bigint range" {
		t.Errorf("offset 92: %v", o)
	}
	var orders int64
	if err := tx.QueryRow(context.Background(), `SELECT orders FROM customer_totals WHERE customer = 'whale'`).Scan(&orders); err != nil || orders != 92 {
		t.Fatalf("whale counted %d orders (%v), want 92", orders, err)
	}
	if ds := tx.DeadLetters(); len(ds) != 8 {
		t.Fatalf("%d dead letters, want 8", len(ds))
	}
}

// TestHandleBatchAppliesTheFirstOfTwoMessagesWithOneOrderID: within one batch the first
// message of an order id is the one applied, and its event (written to the outbox in the
// batch's transaction) and counter carry its values.
func TestHandleBatchAppliesTheFirstOfTwoMessagesWithOneOrderID(t *testing.T) {
	ctx := context.Background()
	k := migrated(t)
	msgs := kafkatxtest.Messages("orders",
		`{"order_id":"D-1","customer":"first","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"D-2","customer":"other","item":"w","quantity":1,"price":5.00}`,
		`{"order_id":"D-1","customer":"second","item":"w","quantity":3,"price":2.00}`,
	)
	svc := &Service{EventsTopic: "order-events", WriteEvents: outbox.Writer{Schema: k.Schema()}.WriteTx}
	tx := k.RunBatch(svc.HandleBatch, msgs...)
	for _, o := range tx.Outcomes() {
		if o.Kind != kafkatxtest.Committed {
			t.Fatalf("%v, want committed", o)
		}
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
	events := tx.Outbox()
	for _, e := range events {
		if e.Topic != "order-events" {
			t.Errorf("event for topic %s", e.Topic)
		}
		got[string(e.Key)] = string(e.Value)
	}
	if len(events) != 2 || got["D-1"] != `{"order_id":"D-1","customer":"first","total_cents":100}` {
		t.Fatalf("events %v, want one per order id, D-1 with the first message's values", got)
	}
}

// TestHandleBatchDeadLettersAnInvalidOrderAlone: an order that does not parse is dead-lettered
// at once with its bytes, and its neighbours apply.
func TestHandleBatchDeadLettersAnInvalidOrderAlone(t *testing.T) {
	k := migrated(t)
	tx := k.RunBatch((&Service{}).HandleBatch, kafkatxtest.Messages("orders",
		`{"order_id":"A-1","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":`,
		`{"order_id":"A-2","customer":"c","item":"w","quantity":2,"price":1.00}`,
	)...)
	if o := tx.Outcome(1); o.Kind != kafkatxtest.DeadLettered || o.ErrorClass != kafkatx.ErrorClassPermanent {
		t.Fatalf("the invalid order: %v, want dead-lettered (permanent)", o)
	}
	for _, off := range []int64{0, 2} {
		if o := tx.Outcome(off); o.Kind != kafkatxtest.Committed {
			t.Fatalf("%v, want committed", o)
		}
	}
	ds := tx.DeadLetters()
	if len(ds) != 1 || string(ds[0].Value) != `{"order_id":` {
		t.Fatalf("dead letters %+v", ds)
	}
	if recs := tx.Outbox(); len(recs) != 1 || recs[0].Topic != "orders.dlq" {
		t.Fatalf("outbox %+v, want the dead letter for orders.dlq", recs)
	}
}

// migrated returns a kit on a fresh schema holding kafkatx's and the service's tables
// (order.Migrate creates them unqualified: the kit's pool has the schema first on its
// search_path).
func migrated(t *testing.T) *kafkatxtest.Kit {
	t.Helper()
	k := kafkatxtest.New(t, nil)
	if err := Migrate(context.Background(), k.Pool()); err != nil {
		t.Fatal(err)
	}
	return k
}
