// Command orders is kafkatx's example service: it consumes orders from Kafka and, per
// message in one PostgreSQL transaction with the watermark advance, records the order and
// adds it to a per-customer running counter. Non-JSON or invalid orders are dead letters.
//
// Its command-line contract is in docs/examples.md: --produce FILE / --generate N produce
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

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/cmd/kafkalog"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/examples/internal/topics"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/shards"
)

type options struct {
	service.Flags
	eventsTopic, produceFile     string
	generate, poisonEvery        int
	crashEvery                   int
	maxOutboxRows                int
	produceOnly, inProcessBroker bool
	traceStderr                  bool
	outboxMode                   string
	outboxPack                   bool
	shards                       service.ShardFlags
	movePartition                int
	moveTo, moveReason           string
}

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	o.Register(fs, service.Flags{Topic: "orders", Group: "orders-processor", Partitions: 3, Schema: pg.DefaultSchema, MaxAttempts: 5, BatchSize: order.DefaultBatchSize}, "message")
	fs.BoolVar(&o.inProcessBroker, "in-process-broker", false, "run on an in-process Kafka broker (the zero-setup demo of make demo) instead of --brokers; its data is gone when the process exits")
	fs.Lookup("topic").Usage = "topic to produce to and consume from"
	fs.StringVar(&o.eventsTopic, "events-topic", "order-events", "topic for one event per applied order (through the outbox); empty: no events")
	fs.StringVar(&o.produceFile, "produce", "", "produce each non-blank line of FILE as one message before consuming (key = order_id when the line is JSON with one)")
	fs.IntVar(&o.generate, "generate", 0, "produce N synthetic orders (ids unique across runs) before consuming")
	fs.IntVar(&o.poisonEvery, "poison-every", 0, "with --generate, make every K-th message a non-JSON poison pill")
	fs.IntVar(&o.crashEvery, "crash-every", 0, "with --generate, make every K-th message a crash pill: a valid-looking order (its own id) with the header "+order.CrashPillHeader+", whose handling makes the process exit with status 3 at once, every time it is handled")
	fs.BoolVar(&o.produceOnly, "produce-only", false, "exit after producing")
	fs.IntVar(&o.maxOutboxRows, "max-outbox-rows", service.DefaultMaxOutboxRows, "partitions wait before a transaction while the outbox holds more rows than this (counted, not estimated), so the relay is not left behind without bound; 0: no bound")
	fs.BoolVar(&o.outboxPack, "outbox-pack", true, "table mode: write each batch's events into a few packed outbox rows (outbox.Writer.Pack) instead of one row an event; every relay of the schema must be at this version or later (the in-process one is; a sidecar kafkatx relay of an older release leaves packs unpublished until upgraded: --outbox-pack=false then, docs/upgrading.md); ignored in WAL mode")
	fs.StringVar(&o.outboxMode, "outbox-mode", "", "how events and dead letters go through the outbox: wal (logical-decoding messages relayed from a replication slot) or table (rows; the default of a new schema). Stored with the schema: empty follows it, a value that conflicts with it exits 2")
	fs.Var(&o.shards, "shard", "a shard, NAME=URL (repeat it, one per shard; the first takes the partitions the directory does not map yet): each partition's kafkatx state and orders live on the shard the directory in --database-url's database maps it to (kafkatx shards assign|move|status); a relay and its retention run per shard, in the shard's outbox mode (in WAL mode each shard has its own slot and checkpoint)")
	fs.IntVar(&o.movePartition, "move-partition", -1, "with --shard: move partition N of --topic (group --group) to the shard --move-to while the service runs elsewhere, its orders with it (order.MovePartition, the shards.Move hook), print the directory row as JSON and exit; nothing is consumed")
	fs.StringVar(&o.moveTo, "move-to", "", "with --move-partition: the target shard's name")
	fs.StringVar(&o.moveReason, "move-reason", "", "with --move-partition: why (audited as shard_move)")
	fs.BoolVar(&o.traceStderr, "trace-stderr", false, "write OpenTelemetry spans to stderr as JSON, sampling every batch and order (without it only orders whose traceparent header is sampled are, and nothing is exported); traced orders' events carry the consumer span's traceparent either way")
	if code, ok := flagcheck.Parse(fs, os.Args[1:]); !ok {
		return code
	}
	o.FromEnv()
	if err := flagcheck.First(o.Check(), o.checkEventsTopic(), o.shards.Check()); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		return 2
	}
	if err := o.LoadKafkaConfigFile(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		return 2
	}
	switch {
	case o.Brokers == "" && !o.inProcessBroker:
		fmt.Fprintln(os.Stderr, "orders: no Kafka: pass --brokers HOST:PORT or set KAFKA_BOOTSTRAP_SERVERS (or --in-process-broker for the demo broker); see --help")
		return 2
	case o.Brokers != "" && o.inProcessBroker:
		fmt.Fprintln(os.Stderr, "orders: --in-process-broker and a broker address (--brokers or KAFKA_BOOTSTRAP_SERVERS) exclude each other; see --help")
		return 2
	case o.maxOutboxRows < 0:
		fmt.Fprintf(os.Stderr, "orders: --max-outbox-rows (%d) must not be negative (0: no bound); see --help\n", o.maxOutboxRows)
		return 2
	case !validMode(o.outboxMode):
		fmt.Fprintf(os.Stderr, "orders: --outbox-mode %q: want wal or table; see --help\n", o.outboxMode)
		return 2
	case o.generate < 0:
		fmt.Fprintf(os.Stderr, "orders: --generate (%d) must not be negative; see --help\n", o.generate)
		return 2
	case o.poisonEvery < 0:
		fmt.Fprintf(os.Stderr, "orders: --poison-every (%d) must not be negative (0: no poison pills); see --help\n", o.poisonEvery)
		return 2
	case o.movePartition >= 0 && (len(o.shards) == 0 || o.moveTo == "" || o.moveReason == ""):
		fmt.Fprintln(os.Stderr, "orders: --move-partition needs --shard flags, --move-to and --move-reason; see --help")
		return 2
	case o.crashEvery < 0:
		fmt.Fprintf(os.Stderr, "orders: --crash-every (%d) must not be negative (0: no crash pills); see --help\n", o.crashEvery)
		return 2
	}
	service.TuneGC()

	log := service.Logger()
	defer log.Sync() //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, o, log); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", service.SessionRefusal(err))
		if errors.Is(err, outbox.ErrModeConflict) {
			return 2
		}
		return 1
	}
	return 0
}

// checkEventsTopic refuses an --events-topic Kafka would refuse (empty: no events).
func (o options) checkEventsTopic() error {
	if o.eventsTopic == "" {
		return nil
	}
	if o.eventsTopic == o.Topic {
		return fmt.Errorf("--events-topic %s: the same topic as --topic (each applied order's event would be consumed again as an order)", o.eventsTopic)
	}
	return flagcheck.Topic("events-topic", o.eventsTopic)
}

func serve(ctx context.Context, o options, log *zap.Logger) error {
	if o.inProcessBroker {
		b, closeBroker, err := startEmbedded(log)
		if err != nil {
			return err
		}
		defer closeBroker()
		o.Brokers = b
		log.Warn("--in-process-broker: running on an in-process Kafka broker; nothing is read from or written to a real cluster", zap.String("brokers", b))
	}
	// The database first when this run consumes: a wrong password or a missing database is
	// named within seconds, not after the topics' 30 s against unreachable brokers; a server
	// not ready yet is waited for (service.Flags.OpenPools).
	var pools *service.Pools
	var probes *service.Probes // --metrics-addr, answering while the database and topics are waited for
	reg := prometheus.NewRegistry()
	if !o.produceOnly {
		if o.DatabaseURL == "" {
			return errors.New("no database: pass --database-url postgres://user:pass@host:port/db or set DATABASE_URL " +
				"(`eval \"$(scripts/dev-services env)\"` after `scripts/dev-services up` starts a local one)")
		}
		var err error
		if probes, err = service.StartProbes(o.MetricsAddr, reg); err != nil {
			return err
		}
		defer probes.Close()
		probes.Stage("waiting for the database")
		if pools, err = o.OpenPools(ctx, log); err != nil {
			return err
		}
		defer pools.Close()
		probes.Stage("creating the topics")
	}
	if o.movePartition >= 0 {
		return movePartition(ctx, pools, o)
	}
	base := o.ClientConfig()
	names := []string{o.Topic, o.Topic + ".dlq"}
	if o.eventsTopic != "" {
		names = append(names, o.eventsTopic)
	}
	if err := topics.Ensure(ctx, log, base, names, o.Partitions, 1, nil, 30*time.Second); err != nil {
		return err
	}
	if o.produceFile != "" || o.generate > 0 {
		sum, err := produce(ctx, kafkalog.Route(log, o.ClientConfig()), o)
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
	return consume(ctx, pools, probes, reg, o, log)
}

func consume(ctx context.Context, pools *service.Pools, probes *service.Probes, reg *prometheus.Registry, o options, log *zap.Logger) error {
	pool := pools.Pool
	probes.Stage("applying the migrations")
	// kafkatx's schema first: with the default search_path ("$user", public) a role named
	// like that schema would otherwise see the example's tables move once it exists. Both
	// migrations take a session-level lock: on the session pool.
	if err := kafkatx.Migrate(ctx, pools.Session, o.Schema); err != nil {
		return err
	}
	if err := order.Migrate(ctx, pools.Session); err != nil {
		return err
	}
	// The outbox mode is stored with the schema; the slot exists before anything is written.
	// With --shard the directory's database holds no outbox (unless it is also a shard): each
	// shard's mode is set, and its slot created, on the shard below, and a slot on the
	// directory's database would only retain its WAL.
	var mode outbox.Mode
	if len(o.shards) == 0 {
		var err error
		if mode, err = outbox.EnsureMode(ctx, pools.Session, o.Schema, outbox.Mode(o.outboxMode)); err != nil {
			return err
		}
	}
	// With --shard: every shard holds kafkatx's schema, the orders tables and its outbox, in
	// the mode --outbox-mode names (empty: each shard's stored one), its relay in that mode.
	set, err := o.shards.Open(ctx, pool, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer set.Close()
	backpressure := outbox.Writer{Schema: o.Schema}.WaitBelow(pool, int64(o.maxOutboxRows))
	if set != nil {
		var waits []func(context.Context) error
		for i, sh := range set.Shards {
			if err := kafkatx.Migrate(ctx, sh.Pool, o.Schema); err != nil {
				return fmt.Errorf("shard %s: %w", sh.Name, err)
			}
			if err := order.Migrate(ctx, sh.Pool); err != nil {
				return fmt.Errorf("shard %s: %w", sh.Name, err)
			}
			m, err := outbox.EnsureMode(ctx, sh.Pool, o.Schema, outbox.Mode(o.outboxMode))
			if err != nil {
				return fmt.Errorf("shard %s: %w", sh.Name, err)
			}
			if i == 0 {
				mode = m // the first shard's, for what names one mode (the relays read each shard's)
			}
			waits = append(waits, outbox.Writer{Schema: o.Schema}.WaitBelow(sh.Pool, int64(o.maxOutboxRows)))
		}
		backpressure = func(ctx context.Context) error { // each shard's outbox under the bound
			for _, w := range waits {
				if err := w(ctx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	tr, err := newTracing(o.traceStderr)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tr.shutdown(sctx)
	}()
	// Trace context per order: the middleware continues each message's traceparent in a
	// consumer span; the event written for the order carries that span's (annotate).
	svc := &order.Service{EventsTopic: o.eventsTopic, WriteEvents: outbox.Writer{Schema: o.Schema, Pack: o.outboxPack}.WriteTx, Annotate: tr.annotate(o.traceStderr),
		CrashPill: func(m *kafkatx.Message) {
			// The seed's incident, on purpose: the process dies in the handler, inside the
			// transaction, before anything commits (no deferred function runs).
			log.Error("crash pill: exiting with status 3", zap.String("topic", m.Topic), zap.Int32("partition", m.Partition),
				zap.Int64("offset", m.Offset), zap.Int("attempt", m.Attempt))
			_ = log.Sync()
			os.Exit(3)
		}}
	ccfg := o.ConsumerConfig(log, reg)
	ccfg.SkipMigrations = true // applied above, on the session pool
	ccfg.Middleware = []kafkatx.Middleware{tr.tracer.Middleware}
	ccfg.Backpressure = backpressure
	ccfg.Shards = set
	c, err := kafkatx.NewBatchConsumer(pool, svc.HandleBatch, ccfg)
	if err != nil {
		return err
	}
	err = service.Run(ctx, service.Options{Pool: pool, Consumer: c, Brokers: o.Brokers, Schema: o.Schema,
		KafkaConfig: o.ClientConfig(), Session: pools.Session.Config().ConnConfig, OutboxMode: mode,
		ExitWhenIdle: o.ExitWhenIdle, Group: o.Group, Shards: set, Topic: o.Topic, Logger: log, Registry: reg, MetricsAddr: o.MetricsAddr, Probes: probes})
	s := c.Stats()
	b, _ := json.Marshal(map[string]int64{"processed": s.Processed, "duplicates": s.Duplicates, "retries": s.Retries, "dead_lettered": s.DeadLettered})
	fmt.Println(string(b))
	return err
}

func validMode(s string) bool {
	_, err := outbox.ParseMode(s)
	return err == nil
}

// movePartition is --move-partition: the partition's kafkatx state and its orders moved to
// --move-to by shards.Move with the service's hook (order.MovePartition).
func movePartition(ctx context.Context, pools *service.Pools, o options) error {
	set, err := o.shards.Open(ctx, pools.Pool, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer set.Close()
	for _, sh := range set.Shards {
		if err := order.Migrate(ctx, sh.Pool); err != nil {
			return fmt.Errorf("shard %s: %w", sh.Name, err)
		}
	}
	e, err := shards.Move(ctx, set, o.Schema, shards.MoveOptions{Group: o.Group, Topic: o.Topic, Partition: int32(o.movePartition),
		To: o.moveTo, Reason: o.moveReason, Actor: "orders --move-partition", Hook: order.MovePartition})
	if err != nil {
		return err
	}
	b, _ := json.Marshal(e)
	fmt.Println(string(b))
	return nil
}
