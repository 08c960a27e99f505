package kafkatx_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
)

// A batch consumer: one multi-row INSERT per batch of a partition, in the transaction that
// advances the watermark past the whole batch. A bad message is named with FailMessage, so
// the loop re-runs its neighbours without it and retries or dead-letters it alone. It needs
// PostgreSQL and Kafka, so it is compiled, not run.
func ExampleNewBatchConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	c, err := kafkatx.NewBatchConsumer(pool, func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		readings := make([]int64, 0, len(msgs))
		for _, m := range msgs {
			v, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				return kafkatx.FailMessage(m, kafkatx.Permanent(err))
			}
			readings = append(readings, v)
		}
		_, err := tx.Exec(ctx, `INSERT INTO readings (value) SELECT unnest($1::bigint[])`, readings)
		return err // not naming a message: the loop re-runs the batch one message per transaction
	}, &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": os.Getenv("KAFKA_BOOTSTRAP_SERVERS"), "group.id": "readings"},
		Topics: []string{"readings"},
		Batch:  kafkatx.BatchConfig{Size: 1000},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
	}
}

// FailMessage ties an error to one message of a batch; the loop retries or dead-letters
// that message alone.
func ExampleFailMessage() {
	m := &kafkatx.Message{Topic: "readings", Partition: 3, Offset: 1207, Value: []byte("n/a")}
	err := kafkatx.FailMessage(m, kafkatx.Permanent(errors.New("not a number")))
	var me *kafkatx.MessageError
	if errors.As(err, &me) {
		fmt.Println(me.Offset, kafkatx.IsPermanent(err))
	}
	fmt.Println(err)
	// Output:
	// 1207 true
	// offset 1207: permanent: not a number
}
