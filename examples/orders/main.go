// Command orders is kafkatx's example service: it consumes orders from Kafka and, per
// message in one PostgreSQL transaction with the watermark advance, records the order and
// adds it to a per-customer running counter. Non-JSON or invalid orders are dead letters.
//
// Its command-line contract is in EXAMPLES.md: --produce FILE / --generate N produce
// orders, then the service consumes until SIGTERM or --exit-when-idle, and prints one JSON
// summary line on stdout. Logs go to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/internal/service"
	"github.com/kafkatx/kafkatx/internal/topics"
	"github.com/kafkatx/kafkatx/outbox"
)

type options struct {
	brokers, databaseURL, topic, group, eventsTopic, schema string
	partitions                                              int
	produceFile                                             string
	generate, poisonEvery                                   int
	produceOnly                                             bool
	exitWhenIdle, sessionTimeout                            time.Duration
	maxAttempts                                             int
	instanceID                                              string
	batchSize                                               int
}

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	fs := flag.NewFlagSet("orders", flag.ExitOnError)
	fs.StringVar(&o.brokers, "brokers", "", "Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS; none: an in-process broker for the demo)")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL, postgres://user:pass@host:port/db (default $DATABASE_URL)")
	fs.StringVar(&o.topic, "topic", "orders", "topic to produce to and consume from")
	fs.StringVar(&o.group, "group", "orders-processor", "consumer group id")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of topics created if missing")
	fs.StringVar(&o.eventsTopic, "events-topic", "order-events", "topic for one event per applied order (through the outbox); empty: no events")
	fs.StringVar(&o.schema, "schema", "kafkatx", "schema of kafkatx's tables")
	fs.StringVar(&o.produceFile, "produce", "", "produce each non-blank line of FILE as one message before consuming (key = order_id when the line is JSON with one)")
	fs.IntVar(&o.generate, "generate", 0, "produce N synthetic orders (ids unique across runs) before consuming")
	fs.IntVar(&o.poisonEvery, "poison-every", 0, "with --generate, make every K-th message a non-JSON poison pill")
	fs.BoolVar(&o.produceOnly, "produce-only", false, "exit after producing")
	fs.DurationVar(&o.exitWhenIdle, "exit-when-idle", 0, "exit once, for this long, no message arrived and nothing is in flight, in backoff or waiting in the outbox (clock starts at the first assignment; none within 2m: exit 0)")
	fs.DurationVar(&o.sessionTimeout, "session-timeout", 0, "session.timeout.ms of the classic group protocol (default librdkafka's 45s)")
	fs.IntVar(&o.maxAttempts, "max-attempts", 5, "tries, crashes included, before a message is dead-lettered")
	fs.StringVar(&o.instanceID, "instance-id", "", "group.instance.id for static membership (KIP-345): a restarted process with the same id gets its partitions back at once; a clean exit does not leave the group, the broker keeps the member until its session times out")
	fs.IntVar(&o.batchSize, "batch-size", 1000, "most messages of one partition per transaction (the library default is 500; a bulk order service takes more)")
	_ = fs.Parse(os.Args[1:])
	// Environment defaults are read after parsing, so --help never prints a password.
	if o.brokers == "" {
		o.brokers = os.Getenv("KAFKA_BOOTSTRAP_SERVERS")
	}
	if o.databaseURL == "" {
		o.databaseURL = os.Getenv("DATABASE_URL")
	}

	logCfg := zap.NewProductionConfig()
	logCfg.OutputPaths, logCfg.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	log, _ := logCfg.Build()
	defer log.Sync() //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, o, log); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o options, log *zap.Logger) error {
	if o.brokers == "" {
		b, closeBroker, err := startEmbedded(log)
		if err != nil {
			return err
		}
		defer closeBroker()
		o.brokers = b
		log.Info("no --brokers and no KAFKA_BOOTSTRAP_SERVERS: using an in-process broker", zap.String("brokers", b))
	}
	base := kafka.ConfigMap{"bootstrap.servers": o.brokers}
	names := []string{o.topic, o.topic + ".dlq"}
	if o.eventsTopic != "" {
		names = append(names, o.eventsTopic)
	}
	if err := topics.Ensure(ctx, base, names, o.partitions, 1, nil, 30*time.Second); err != nil {
		return err
	}
	if o.produceFile != "" || o.generate > 0 {
		sum, err := produce(ctx, base, o)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(sum)
		fmt.Println(string(b))
		if o.produceOnly {
			return nil
		}
	} else if o.produceOnly {
		return errors.New("--produce-only needs --produce FILE or --generate N")
	}
	if o.databaseURL == "" {
		return errors.New("no database: pass --database-url postgres://user:pass@host:port/db or set DATABASE_URL " +
			"(`eval \"$(scripts/dev-services env)\"` after `scripts/dev-services up` starts a local one)")
	}
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	return consume(ctx, pool, o, log)
}

func consume(ctx context.Context, pool *pgxpool.Pool, o options, log *zap.Logger) error {
	// kafkatx's schema first: with the default search_path ("$user", public) a role named
	// like that schema would otherwise see the example's tables move once it exists.
	if err := kafkatx.Migrate(ctx, pool, o.schema); err != nil {
		return err
	}
	if err := order.Migrate(ctx, pool); err != nil {
		return err
	}
	svc := &order.Service{EventsTopic: o.eventsTopic, WriteEvents: outbox.Writer{Schema: o.schema}.Write}
	kcfg := kafka.ConfigMap{"bootstrap.servers": o.brokers, "group.id": o.group}
	if o.instanceID != "" {
		kcfg["group.instance.id"] = o.instanceID
	}
	if o.sessionTimeout > 0 {
		kcfg["session.timeout.ms"] = int(o.sessionTimeout.Milliseconds())
	}
	c, err := kafkatx.NewBatchConsumer(pool, svc.HandleBatch, &kafkatx.Config{
		Kafka:  kcfg,
		Topics: []string{o.topic},
		Schema: o.schema,
		Logger: log,
		Retry:  kafkatx.RetryPolicy{MaxAttempts: o.maxAttempts},
		Batch:  kafkatx.BatchConfig{Size: o.batchSize},
	})
	if err != nil {
		return err
	}
	err = service.Run(ctx, service.Options{Pool: pool, Consumer: c, Brokers: o.brokers, Schema: o.schema, ExitWhenIdle: o.exitWhenIdle, Logger: log})
	s := c.Stats()
	b, _ := json.Marshal(map[string]int64{"processed": s.Processed, "duplicates": s.Duplicates, "retries": s.Retries, "dead_lettered": s.DeadLettered})
	fmt.Println(string(b))
	return err
}
