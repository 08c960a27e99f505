package kafkatx_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
)

// Writing to the outbox: the record is published (by outbox/relay in-process, or the
// `kafkatx relay` sidecar) if and only if the transaction that wrote it commits. Inside a
// Handler, write with the handler's tx; elsewhere (an HTTP handler, a job), with your own.
// It needs PostgreSQL, so it is compiled, not run.
func Example_writeToTheOutbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := kafkatx.Migrate(ctx, pool, ""); err != nil { // the outbox table, in schema kafkatx
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET closed = true WHERE id = $1`, "acct-7"); err != nil {
			return err
		}
		ids, err := outbox.WriteTx(ctx, tx, outbox.Record{
			Topic:   "account-events",
			Key:     []byte("acct-7"), // records of one key are published in commit order
			Value:   []byte(`{"account":"acct-7","event":"closed"}`),
			Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
		})
		if err != nil {
			return err
		}
		fmt.Println("outbox row", ids[0])
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
}
