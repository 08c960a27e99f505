// Command dagtrigger is kafkatx's DAG-trigger example: it consumes a topic of Debezium change
// events (JSON converter, with or without schemas) and starts one Apache Airflow DAG run per
// event through Airflow 3's REST API v2, with the event's `after` row as the run's conf.
//
// Exactly one run per event, across crashes and redeliveries: the run's dag_run_id is derived
// from the event's source position (PostgreSQL: source.lsn and source.txId), so every retry
// of the same event posts the same run id and Airflow answers 409 Conflict, which counts as
// success. The event's key is claimed in the consumer's transaction, so a copy of the event
// re-published at another offset is skipped without calling Airflow.
//
// Its command-line contract is in EXAMPLES.md. stdout carries only the JSON summary line;
// logs go to stderr.
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
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/service"
	"github.com/kafkatx/kafkatx/internal/topics"
)

type options struct {
	brokers, databaseURL, topic, group, schema string
	airflowURL, dagID, tokenFile, instanceID   string
	partitions, maxAttempts, batchSize         int
	exitWhenIdle, sessionTimeout, keyRetention time.Duration
	airflowTimeout                             time.Duration
}

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	fs := flag.NewFlagSet("dagtrigger", flag.ExitOnError)
	fs.StringVar(&o.brokers, "brokers", "", "Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS)")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL, postgres://user:pass@host:port/db (default $DATABASE_URL)")
	fs.StringVar(&o.topic, "topic", "", "topic of Debezium change events to consume (required)")
	fs.StringVar(&o.group, "group", "dagtrigger", "consumer group id")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of topics created if missing")
	fs.StringVar(&o.airflowURL, "airflow-url", "", "base URL of the Airflow API server, http://host:8080 (required); /api/v2/dags/{dag_id}/dagRuns is appended")
	fs.StringVar(&o.dagID, "dag-id", "", "DAG to start one run of per event (required)")
	fs.StringVar(&o.tokenFile, "airflow-token-file", "", "file holding a bearer token for Airflow, re-read per request; without it no Authorization header is sent")
	fs.DurationVar(&o.airflowTimeout, "airflow-timeout", 10*time.Second, "timeout of one request to Airflow")
	fs.StringVar(&o.schema, "schema", "kafkatx", "schema of kafkatx's tables")
	fs.DurationVar(&o.exitWhenIdle, "exit-when-idle", 0, "exit once, for this long, no message arrived and nothing is in flight, in backoff or waiting in the outbox (clock starts at the first assignment; none within 2m: exit 0)")
	fs.DurationVar(&o.sessionTimeout, "session-timeout", 0, "session.timeout.ms of the classic group protocol (default librdkafka's 45s)")
	fs.IntVar(&o.maxAttempts, "max-attempts", 5, "tries, crashes included, before an event is dead-lettered")
	fs.StringVar(&o.instanceID, "instance-id", "", "group.instance.id for static membership (KIP-345): a restarted process with the same id gets its partitions back at once; a clean exit does not leave the group, the broker keeps the member until its session times out")
	fs.IntVar(&o.batchSize, "batch-size", 20, "most events of one partition per transaction (each costs one Airflow request)")
	fs.DurationVar(&o.keyRetention, "key-retention", 7*24*time.Hour, "how long an event's source position is remembered to skip re-published copies")
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
		fmt.Fprintln(os.Stderr, "dagtrigger:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o options, log *zap.Logger) error {
	switch {
	case o.brokers == "":
		return errors.New("no brokers: pass --brokers host:port or set KAFKA_BOOTSTRAP_SERVERS")
	case o.databaseURL == "":
		return errors.New("no database: pass --database-url postgres://user:pass@host:port/db or set DATABASE_URL")
	case o.topic == "":
		return errors.New("--topic is required")
	case o.airflowURL == "":
		return errors.New("--airflow-url is required (the Airflow API server's base URL)")
	case o.dagID == "":
		return errors.New("--dag-id is required")
	}
	af, err := airflow.New(airflow.Config{
		BaseURL:        o.airflowURL,
		TokenFile:      o.tokenFile,
		RequestTimeout: o.airflowTimeout,
		Logger:         log,
	})
	if err != nil {
		return err
	}
	base := kafka.ConfigMap{"bootstrap.servers": o.brokers}
	if err := topics.Ensure(ctx, base, []string{o.topic, o.topic + ".dlq"}, o.partitions, 1, nil, 30*time.Second); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if err := kafkatx.Migrate(ctx, pool, o.schema); err != nil {
		return err
	}

	t := &trigger{
		airflow:   af,
		dagID:     o.dagID,
		schema:    o.schema,
		scope:     "dagtrigger/" + o.group + "/" + o.dagID,
		retention: o.keyRetention,
		log:       log.Named("dagtrigger"),
	}
	kcfg := kafka.ConfigMap{"bootstrap.servers": o.brokers, "group.id": o.group}
	if o.instanceID != "" {
		kcfg["group.instance.id"] = o.instanceID
	}
	if o.sessionTimeout > 0 {
		kcfg["session.timeout.ms"] = int(o.sessionTimeout.Milliseconds())
	}
	c, err := kafkatx.NewConsumer(pool, t.handle, &kafkatx.Config{
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
	b, _ := json.Marshal(map[string]int64{
		"processed":       s.Processed,
		"duplicates":      s.Duplicates,
		"retries":         s.Retries,
		"dead_lettered":   s.DeadLettered,
		"runs_created":    t.created.Load(),
		"runs_existing":   t.existing.Load(),
		"events_repeated": t.repeated.Load(),
		"tombstones":      t.tombstones.Load(),
	})
	fmt.Println(string(b))
	return err
}
