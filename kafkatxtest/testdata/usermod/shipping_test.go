package shipping

import (
	"testing"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
)

func TestShipmentRequestedForAPaidOrder(t *testing.T) {
	k := kafkatxtest.New(t, nil)
	tx := k.Run(Handler(k.Schema()), kafkatxtest.Messages("orders-paid", `{"id":"o-1","address":"1 Main St"}`)...)
	if o := tx.Outcome(0); o.Kind != kafkatxtest.Committed {
		t.Fatalf("outcome %v, want committed", o)
	}
	recs := tx.Outbox()
	if len(recs) != 1 || recs[0].Topic != "shipment-requests" || string(recs[0].Key) != "o-1" {
		t.Fatalf("outbox %+v, want one shipment request for o-1", recs)
	}
}

func TestNotJSONIsDeadLetteredAtOnce(t *testing.T) {
	k := kafkatxtest.New(t, nil)
	tx := k.Run(Handler(k.Schema()), kafkatxtest.Messages("orders-paid", `{"id":`)...)
	o := tx.Outcome(0)
	if o.Kind != kafkatxtest.DeadLettered || o.ErrorClass != kafkatx.ErrorClassPermanent || o.Attempt != 1 {
		t.Fatalf("outcome %v, want dead-lettered (permanent) at attempt 1", o)
	}
	ds := tx.DeadLetters()
	if len(ds) != 1 || string(ds[0].Value) != `{"id":` || ds[0].Topic != "orders-paid" {
		t.Fatalf("dead letters %+v", ds)
	}
	recs := tx.Outbox()
	if len(recs) != 1 || recs[0].Topic != "orders-paid.dlq" {
		t.Fatalf("outbox %+v, want only the dead letter's record", recs)
	}
}

func TestMissingAddressIsAnAttemptThenADeadLetter(t *testing.T) {
	k := kafkatxtest.New(t, &kafkatxtest.Options{Config: &kafkatx.Config{Retry: kafkatx.RetryPolicy{MaxAttempts: 3}}})
	m := kafkatxtest.NewMessage("orders-paid", 4, 17, []byte("o-2"), []byte(`{"id":"o-2"}`))
	tx := k.Run(Handler(k.Schema()), m)
	if o := tx.Outcome(17); o.Kind != kafkatxtest.Retried || o.ErrorClass != kafkatx.ErrorClassHandler {
		t.Fatalf("first try: %v, want an attempt the loop retries", o)
	}
	if n := len(tx.DeadLetters()); n != 0 {
		t.Fatalf("%d dead letters after the first try", n)
	}
	tx.Rollback(t.Context())

	m.Attempt = 3
	tx = k.Run(Handler(k.Schema()), m)
	if o := tx.Outcome(17); o.Kind != kafkatxtest.DeadLettered || o.DeadLetter.Attempts != 3 {
		t.Fatalf("third try: %v, want dead-lettered after 3 attempts", o)
	}
}

func TestAPanicIsCapturedAsAnAttempt(t *testing.T) {
	k := kafkatxtest.New(t, nil)
	tx := k.Run(Handler(k.Schema()), kafkatxtest.Messages("orders-paid",
		`{"id":"o-3","address":"2 High St","weight_grams":40000}`,
		`{"id":"o-4","address":"3 Low Rd"}`)...)
	o := tx.Outcome(0)
	if o.Kind != kafkatxtest.Retried || o.ErrorClass != kafkatx.ErrorClassPanic || o.Stack == "" {
		t.Fatalf("heavy order: %v (stack %d bytes), want a captured panic, an attempt", o, len(o.Stack))
	}
	t.Logf("captured: %s", o.ErrorMessage)
	if o := tx.Outcome(1); o.Kind != kafkatxtest.Committed {
		t.Fatalf("the next order: %v, want committed", o)
	}
}
