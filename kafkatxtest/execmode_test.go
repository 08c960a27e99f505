package kafkatxtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/kafkatxtest"
	"github.com/kafkatx/kafkatx/outbox"
)

// The kit's statements (the loop's transaction body: business keys, attempts, dead letters
// with their outbox records, the handler's outbox writes) in every query exec mode pgx v5
// offers (issue 48), on a kit whose Options.Pool is in that mode.
func TestKitInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range testenv.QueryExecModeNames {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pool := testenv.PostgresInMode(t, mode)
			k := kafkatxtest.New(t, &kafkatxtest.Options{Pool: pool, Config: &kafkatx.Config{
				Idempotency: kafkatx.IdempotencyConfig{Key: idempotency.FromHeader("biz")}}})
			w := outbox.Writer{Schema: k.Schema()}
			h := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
				for _, m := range msgs {
					switch string(m.Value) {
					case "poison":
						return kafkatx.FailMessage(m, kafkatx.Permanent(errors.New("poison")))
					case "flaky":
						return kafkatx.FailMessage(m, errors.New("flaky"))
					}
					if _, err := w.WriteTx(ctx, tx, outbox.Record{Topic: "events", Key: m.Key, Value: m.Value, Source: m.OutboxSource()}); err != nil {
						return err
					}
				}
				return nil
			}
			msgs := []*kafkatx.Message{
				kafkatxtest.NewMessage("orders", 0, 0, []byte("k"), []byte("a"), kafkatxtest.Header("biz", `a\b`)),
				kafkatxtest.NewMessage("orders", 0, 1, []byte("k"), []byte("a again"), kafkatxtest.Header("biz", `a\b`)),
				kafkatxtest.NewMessage("orders", 0, 2, nil, []byte("poison")),
				kafkatxtest.NewMessage("orders", 0, 3, nil, []byte("flaky")),
				kafkatxtest.NewMessage("orders", 0, 4, []byte{0, 0xff}, []byte("b")),
			}
			want := []kafkatxtest.Kind{kafkatxtest.Committed, kafkatxtest.Duplicate, kafkatxtest.DeadLettered, kafkatxtest.Retried, kafkatxtest.Committed}
			out := k.RunBatch(h, msgs...).Outcomes()
			if len(out) != len(want) {
				t.Fatalf("outcomes %v, want %v", out, want)
			}
			for i, o := range out {
				if o.Kind != want[i] {
					t.Errorf("message %d: %v, want %v", i, o, want[i])
				}
			}
		})
	}
}
