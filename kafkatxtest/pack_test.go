package kafkatxtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// Tx.Outbox shows the records of packed rows (outbox.Writer.Pack) one by one, in write order,
// with their own ids and the outbox ids their messages give them, beside plain rows.
func TestKitOutboxShowsPackedRecords(t *testing.T) {
	t.Parallel()
	k := kafkatxtest.New(t, nil)
	packed := outbox.Writer{Schema: k.Schema(), Pack: true}
	plain := outbox.Writer{Schema: k.Schema()}
	h := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		if _, err := packed.WriteTx(ctx, tx, outbox.Record{Topic: "ev", Key: m.Key, Value: append([]byte("a "), m.Value...)},
			outbox.Record{Topic: "ev", Value: append([]byte("b "), m.Value...), Headers: []outbox.Header{{Key: "h", Value: []byte("v")}}}); err != nil {
			return err
		}
		_, err := plain.WriteTx(ctx, tx, outbox.Record{Topic: "ev", Key: m.Key, Value: append([]byte("c "), m.Value...)})
		return err
	}
	msgs := kafkatxtest.Messages("orders", "x", "y")
	tx := k.Run(h, msgs...)
	recs := tx.Outbox()
	var got []string
	ids := map[int64]bool{}
	for _, r := range recs {
		got = append(got, string(r.Value))
		ids[r.ID] = true
	}
	if want := "[a x b x c x a y b y c y]"; len(recs) != 6 || stringOf(got) != want {
		t.Fatalf("outbox values %v, want %s", got, want)
	}
	if len(ids) != 6 || header(recs[1].Record, "h") != "v" || recs[1].Key != nil {
		t.Fatalf("records %+v: want 6 ids, the second with its header and a nil key", recs)
	}
	// The packed records' outbox ids are the loop's: position 0 and 1 of their message.
	for i, m := range msgs {
		for pos := uint32(0); pos < 2; pos++ {
			if want := outbox.SourceID(m.OutboxSource(), pos); recs[3*i+int(pos)].OutboxID != want {
				t.Errorf("message %d, record %d: outbox id %s, want %s", i, pos, recs[3*i+int(pos)].OutboxID, want)
			}
		}
	}
}

func stringOf(v []string) string {
	s := "["
	for i, x := range v {
		if i > 0 {
			s += " "
		}
		s += x
	}
	return s + "]"
}
