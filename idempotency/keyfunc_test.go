package idempotency_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/pg"
)

// sample reads a Debezium change event from testdata (shaped after the Debezium reference
// documentation's examples for each connector).
func sample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func headers(kv ...string) func(string) ([]byte, bool) {
	return func(name string) ([]byte, bool) {
		for i := len(kv) - 2; i >= 0; i -= 2 {
			if kv[i] == name {
				return []byte(kv[i+1]), true
			}
		}
		return nil, false
	}
}

func TestFromHeaderAndOutboxID(t *testing.T) {
	t.Parallel()
	m := idempotency.Message{Header: headers("idempotency-key", "old", "idempotency-key", "order-42", "kafkatx-outbox-id", "981")}
	if k, ok, err := idempotency.FromHeader("idempotency-key")(m); k != "order-42" || !ok || err != nil {
		t.Errorf("FromHeader = %q %v %v; want the last header's value", k, ok, err)
	}
	if k, ok, _ := idempotency.FromOutboxID()(m); k != "outbox:981" || !ok {
		t.Errorf("FromOutboxID = %q %v", k, ok)
	}
	if _, ok, _ := idempotency.FromHeader("missing")(m); ok {
		t.Error("missing header gave a key")
	}
	if _, ok, _ := idempotency.FromHeader("idempotency-key")(idempotency.Message{}); ok {
		t.Error("message without headers gave a key")
	}
	if _, ok, _ := idempotency.FromHeader("e")(idempotency.Message{Header: headers("e", "")}); ok {
		t.Error("empty header gave a key")
	}
}

func TestFromJSONField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		value string
		path  []string
		want  string
		ok    bool
		err   bool
	}{
		{`{"order_id":"o-1"}`, []string{"order_id"}, "o-1", true, false},
		{`{"order_id":12345678901234567890}`, []string{"order_id"}, "12345678901234567890", true, false},
		{`{"payload":{"id":"x"}}`, []string{"payload", "id"}, "x", true, false},
		{`{"other":1}`, []string{"order_id"}, "", false, false},
		{`{"order_id":null}`, []string{"order_id"}, "", false, false},
		{`{"order_id":""}`, []string{"order_id"}, "", false, false},
		{``, []string{"order_id"}, "", false, false},
		{`{"order_id":{"a":1}}`, []string{"order_id"}, "", false, true},
		{`{"order_id":true}`, []string{"order_id"}, "", false, true},
		{`not json`, []string{"order_id"}, "", false, true},
		{`{"payload":"s"}`, []string{"payload", "id"}, "", false, true},
	}
	for _, c := range cases {
		k, ok, err := idempotency.FromJSONField(c.path...)(idempotency.Message{Value: []byte(c.value)})
		if k != c.want || ok != c.ok || (err != nil) != c.err {
			t.Errorf("%s %v: got %q %v %v", c.value, c.path, k, ok, err)
		}
	}
}

func TestFirstOf(t *testing.T) {
	t.Parallel()
	f := idempotency.FirstOf(idempotency.FromOutboxID(), idempotency.FromHeader("idempotency-key"), idempotency.FromJSONField("id"))
	m := idempotency.Message{Value: []byte(`{"id":"v"}`), Header: headers("idempotency-key", "h")}
	if k, _, _ := f(m); k != "h" {
		t.Errorf("FirstOf = %q, want the header's key", k)
	}
	m.Header = headers("kafkatx-outbox-id", "7", "idempotency-key", "h")
	if k, _, _ := f(m); k != "outbox:7" {
		t.Errorf("FirstOf = %q, want the outbox id", k)
	}
	m.Header = nil
	if k, _, _ := f(m); k != "v" {
		t.Errorf("FirstOf = %q, want the JSON field", k)
	}
}

// TestRepublishedEventAppliedOnce: the same CDC event at two offsets (a connector restarted
// from an older offset, a mirror) yields one key, and claiming it in the transactions that
// apply each copy lets only the first one through.
func TestRepublishedEventAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	f := idempotency.FromDebezium()
	value := sample(t, "pg_update.json")
	applied := 0
	for offset := int64(10); offset <= 30; offset += 20 {
		m := idempotency.Message{Topic: "cdc", Partition: 0, Offset: offset, Key: []byte(`{"id":1}`), Value: value}
		key, ok, err := f(m)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			first, err := idempotency.Store{Schema: b.schema, Retention: pg.KeepForever}.ClaimTx(ctx, tx, "orders-group/0", key)
			if first {
				applied++
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if applied != 1 {
		t.Fatalf("re-published event applied %d times, want 1", applied)
	}
}
