package kafkatxotel_test

import (
	"context"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxotel"
	"github.com/kafkatx/kafkatx/outbox"
)

// A batch consumer whose events continue each order's trace: the middleware starts a span per
// traced message (child of its producer's) and sets m.Context() to it; InjectOutbox writes that
// context into the event's headers, which the relay publishes.
func Example() {
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider() // with your exporter: sdktrace.WithBatcher(otlptracehttp.New(...))
	defer tp.Shutdown(ctx)             //nolint:errcheck
	tr := kafkatxotel.New(&kafkatxotel.Config{TracerProvider: tp})

	handler := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		events := make([]outbox.Record, len(msgs))
		for i, m := range msgs {
			events[i] = outbox.Record{Topic: "order-events", Key: m.Key, Value: m.Value}
			tr.InjectOutbox(m.Context(), &events[i])
		}
		_, err := outbox.WriteTx(ctx, tx, events...)
		return err
	}
	pool, err := pgxpool.New(ctx, "postgres://localhost/orders")
	if err != nil {
		return
	}
	c, err := kafkatx.NewBatchConsumer(pool, handler, &kafkatx.Config{
		Kafka:      kafka.ConfigMap{"bootstrap.servers": "localhost:9092", "group.id": "orders-processor"},
		Topics:     []string{"orders"},
		Middleware: []kafkatx.Middleware{tr.Middleware}, // first: its spans cover later middleware
	})
	if err != nil {
		return
	}
	_ = c.Run // c.Run(ctx) consumes until ctx is cancelled
}
