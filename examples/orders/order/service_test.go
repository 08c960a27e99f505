package order

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestHandleBatchRefusesACustomerTotalPastBigint applies 100 maximal orders of one customer in
// one batch: the order that would take the running total past int64 fails alone, as a
// permanent error, instead of wrapping around.
func TestHandleBatchRefusesACustomerTotalPastBigint(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
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
