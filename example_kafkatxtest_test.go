package kafkatx_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// applyPayment is the handler under test: it records a payment and publishes an event
// through the outbox of schema (kafkatx's tables).
func applyPayment(schema string) kafkatx.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		var p struct {
			ID    string `json:"id"`
			Cents int64  `json:"cents"`
		}
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return kafkatx.Permanent(err)
		}
		if p.Cents <= 0 {
			return errors.New("the ledger refuses it") // a retryable failure: an attempt
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, cents) VALUES ($1, $2)`, p.ID, p.Cents); err != nil {
			return err
		}
		_, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, outbox.Record{Topic: "payment-events", Key: []byte(p.ID), Value: m.Value})
		return err
	}
}

// testApplyPayment is a test of applyPayment with kafkatxtest: PostgreSQL from DATABASE_URL,
// no Kafka. A test function calls it: func TestApplyPayment(t *testing.T) { testApplyPayment(t) }.
func testApplyPayment(t *testing.T) {
	k := kafkatxtest.New(t, nil) // a fresh migrated schema, dropped when the test ends
	if _, err := k.Pool().Exec(t.Context(), `CREATE TABLE payments (id text PRIMARY KEY, cents bigint)`); err != nil {
		t.Fatal(err)
	}
	tx := k.Run(applyPayment(k.Schema()), kafkatxtest.Messages("payments",
		`{"id":"p1","cents":500}`, // offset 0
		`{"id":`,                  // offset 1: not JSON
		`{"id":"p3","cents":0}`,   // offset 2
	)...)

	if o := tx.Outcome(0); o.Kind != kafkatxtest.Committed {
		t.Errorf("p1: %v", o)
	}
	if o := tx.Outcome(1); o.Kind != kafkatxtest.DeadLettered || o.ErrorClass != kafkatx.ErrorClassPermanent {
		t.Errorf("bad JSON: %v, want dead-lettered at once", o)
	}
	if o := tx.Outcome(2); o.Kind != kafkatxtest.Retried || o.Attempt != 1 {
		t.Errorf("p3: %v, want an attempt the loop retries", o)
	}
	// The events and dead letters written in the (rolled-back) transaction.
	var topics []string
	for _, r := range tx.Outbox() {
		topics = append(topics, r.Topic)
	}
	if len(topics) != 2 || topics[0] != "payment-events" || topics[1] != "payments.dlq" {
		t.Errorf("outbox topics %v, want the p1 event and the dead letter's record", topics)
	}
	if ds := tx.DeadLetters(); len(ds) != 1 || ds[0].Offset != 1 {
		t.Errorf("dead letters %+v", ds)
	}

	// At the last attempt (Config.Retry.MaxAttempts, 5 by default) the same failure is a
	// dead letter.
	last := kafkatxtest.NewMessage("payments", 0, 2, nil, []byte(`{"id":"p3","cents":0}`))
	last.Attempt = kafkatx.DefaultMaxAttempts
	if o := k.Run(applyPayment(k.Schema()), last).Outcome(2); o.Kind != kafkatxtest.DeadLettered || o.ErrorClass != kafkatx.ErrorClassHandler {
		t.Errorf("p3 at its last attempt: %v", o)
	}
}

// Testing a handler without Kafka: kafkatxtest runs it the way the consumer loop would, in a
// transaction that is rolled back, and reports per message whether the loop would commit it,
// retry it or dead-letter it. The test above needs PostgreSQL, so this is compiled, not run
// (the repository's own tests run testApplyPayment).
func Example_testAHandler() {
	// In a _test.go file of your service:
	//
	//	func TestApplyPayment(t *testing.T) { testApplyPayment(t) }
}
