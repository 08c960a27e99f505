package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// TestWALRelayCarriesTheSourceID: in WAL mode a record written for an input message
// (outbox.Source) is published under the id derived from that message, not the commit LSN's —
// so the same message processed again on another timeline publishes the same id — without the
// carrier header; a record without a Source keeps the commit-position id.
func TestWALRelayCarriesTheSourceID(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	b.start(t, b.config(t))
	src := &outbox.Source{Scope: "g/0", Topic: "orders", Partition: 1, Offset: 41}
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := outbox.WriteTx(context.Background(), tx,
			outbox.Record{Topic: b.topic, Key: []byte("a"), Value: []byte("sourced"), Source: src},
			outbox.Record{Topic: b.topic, Key: []byte("b"), Value: []byte("plain")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs := readAll(t, b.brokers, b.topic, 2, time.Second, 60*time.Second)
	if len(msgs) != 2 {
		t.Fatalf("%d records published, want 2", len(msgs))
	}
	want := outbox.SourceID(&outbox.Source{Scope: "g/0", Topic: "orders", Partition: 1, Offset: 41}, 0).String()
	for _, m := range msgs {
		var id string
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderSourceID {
				t.Fatalf("the carrier header %s was published", outbox.HeaderSourceID)
			}
			if h.Key == outbox.HeaderOutboxID {
				id = string(h.Value)
			}
		}
		switch string(m.Value) {
		case "sourced":
			if id != want {
				t.Fatalf("the sourced record was published under %q, want the derived %s", id, want)
			}
		case "plain":
			if id == "" || id == want {
				t.Fatalf("the plain record was published under %q", id)
			}
		}
	}
}
