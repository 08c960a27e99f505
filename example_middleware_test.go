package kafkatx_test

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
)

// A middleware that logs each batch the handler ran: its partition, offsets, size and
// outcome. It runs inside the batch's transaction, so the log line says what the handler
// answered, not whether the transaction committed (HookBatchCommitted says that).
func ExampleMiddleware_logging() {
	log := zap.NewExample() // JSON lines on stdout, no timestamps: for the example's output
	logging := func(next kafkatx.BatchHandler) kafkatx.BatchHandler {
		return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
			err := next(ctx, tx, msgs)
			first, last := msgs[0], msgs[len(msgs)-1]
			group, _ := kafkatx.GroupFromContext(ctx)
			log.Info("batch handled", zap.String("group", group), zap.String("topic", first.Topic), zap.Int32("partition", first.Partition),
				zap.Int64("first_offset", first.Offset), zap.Int64("last_offset", last.Offset), zap.Int("messages", len(msgs)), zap.Error(err))
			return err
		}
	}
	cfg := &kafkatx.Config{
		Kafka:      kafka.ConfigMap{"bootstrap.servers": "localhost:9092", "group.id": "orders-processor"},
		Topics:     []string{"orders"},
		Middleware: []kafkatx.Middleware{logging},
	}
	_ = cfg // kafkatx.NewConsumer(pool, handler, cfg) applies it to every batch

	// Called here by hand to show its output; the Consumer calls it in each transaction.
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		return kafkatx.FailMessage(msgs[1], fmt.Errorf("bad order"))
	}
	msgs := []*kafkatx.Message{{Topic: "orders", Partition: 2, Offset: 41}, {Topic: "orders", Partition: 2, Offset: 42}}
	_ = logging(handler)(context.Background(), nil, msgs)
	// Output:
	// {"level":"info","msg":"batch handled","group":"","topic":"orders","partition":2,"first_offset":41,"last_offset":42,"messages":2,"error":"offset 42: bad order"}
}

// A middleware that times the handler per batch and reports slow ones. Middleware[0] is
// the outermost: put timing first to include the other middleware's time, last to time the
// handler alone.
func ExampleMiddleware_timing() {
	type observation struct {
		topic    string
		messages int
		took     time.Duration
	}
	// In a service: a Prometheus histogram, an OpenTelemetry metric. A channel must never
	// block the loop (the middleware runs inside every batch's transaction): send without
	// waiting, and drop what nobody reads.
	observed := make(chan observation, 1)
	timing := func(next kafkatx.BatchHandler) kafkatx.BatchHandler {
		return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
			start := time.Now()
			err := next(ctx, tx, msgs)
			select {
			case observed <- observation{topic: msgs[0].Topic, messages: len(msgs), took: time.Since(start)}:
			default: // the reader is behind: drop this observation rather than stall the partition
			}
			return err
		}
	}
	cfg := &kafkatx.Config{
		Kafka:      kafka.ConfigMap{"bootstrap.servers": "localhost:9092", "group.id": "orders-processor"},
		Topics:     []string{"orders"},
		Middleware: []kafkatx.Middleware{timing},
	}
	_ = cfg

	handler := func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		time.Sleep(10 * time.Millisecond) // the handler's database work
		return nil
	}
	_ = timing(handler)(context.Background(), nil, []*kafkatx.Message{{Topic: "orders"}, {Topic: "orders"}, {Topic: "orders"}})
	o := <-observed
	fmt.Printf("%s: %d messages in at least 10ms: %v\n", o.topic, o.messages, o.took >= 10*time.Millisecond)
	// Output:
	// orders: 3 messages in at least 10ms: true
}
