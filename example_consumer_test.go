package kafkatx_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
)

// A consumer that applies each order once: the INSERT, the watermark advance and any dead
// letter commit in one PostgreSQL transaction, and the Kafka offset is committed after it.
// It needs PostgreSQL (DATABASE_URL) and a Kafka broker (KAFKA_BOOTSTRAP_SERVERS), so it is
// compiled, not run.
func ExampleNewConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	c, err := kafkatx.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		var o struct {
			ID    string `json:"id"`
			Cents int64  `json:"cents"`
		}
		if err := json.Unmarshal(m.Value, &o); err != nil || o.ID == "" {
			// Dead-lettered at once, with the record's bytes: no retry can fix it.
			return kafkatx.Permanent(errors.Join(errors.New("not an order"), err))
		}
		// Any other error rolls back and is retried with backoff (Config.Retry), then
		// dead-lettered after MaxAttempts; a panic counts as a failed attempt.
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, cents) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, o.ID, o.Cents)
		return err
	}, &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": os.Getenv("KAFKA_BOOTSTRAP_SERVERS"), "group.id": "orders-processor"},
		Topics: []string{"orders"},
		Logger: zap.NewExample(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Run migrates kafkatx's schema, joins the group and processes until ctx is cancelled;
	// then it finishes in-flight transactions, commits the offsets and leaves the group.
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
	}
}

// Permanent marks a failure no retry can fix; the loop dead-letters the message at once.
// Wrapping it further keeps the mark.
func ExamplePermanent() {
	err := fmt.Errorf("order 42: %w", kafkatx.Permanent(errors.New("price is negative")))
	fmt.Println(kafkatx.IsPermanent(err))
	fmt.Println(kafkatx.IsPermanent(errors.New("connection refused")))
	fmt.Println(err)
	// Output:
	// true
	// false
	// order 42: permanent: price is negative
}
