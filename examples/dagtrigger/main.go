// Command dagtrigger is kafkatx's DAG-trigger example: it consumes a topic of Debezium change
// events (JSON converter, with or without schemas) and starts one Apache Airflow DAG run per
// event through Airflow 3's REST API v2, with the event's `after` row as the run's conf.
//
// Exactly one run per event, across crashes and redeliveries: the run's dag_run_id is derived
// from the event's idempotency key (idempotency.DebeziumEvent.Key: the source position and
// the row's identity; a snapshot row's identity and content), so every retry of the same
// event posts the same run id and Airflow answers 409 Conflict, which counts as success. The
// key is claimed in the consumer's transaction, so a copy of the event re-published at
// another offset, re-sent by a restarted connector or re-read by a restarted snapshot is
// skipped without calling Airflow. Only the ops in --cdc-ops start runs (default c,u,d,r:
// truncates and logical messages are skipped); tombstones, heartbeats and transaction
// metadata never do.
//
// With --asset NAME instead of --dag-id it creates one asset event per event on the asset
// named NAME (POST /api/v2/assets/events), its extra carrying kafkatx_id (the run id the event
// would get) and the row; a try that may have posted already reads the asset's events back
// instead of posting again. Every run or asset event is recorded in the Airflow ledger in the
// transaction that advances the watermark (`kafkatx airflow status|repair`).
//
// Its command-line contract is in docs/examples.md. stdout carries only the JSON summary line;
// logs go to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/examples/internal/topics"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/limit"
	"github.com/kafkatx/kafkatx/pg"
)

type options struct {
	service.Flags
	airflowURL, dagID, asset, tokenFile   string
	username, passwordFile                string
	cdcOps, deleteBefore                  string
	keyRetention, airflowTimeout, waitMax time.Duration
	minCalls, maxCalls                    int
	paused                                pausedFlags // --when-paused, --airflow-dag-state-interval (paused.go)
}

// defaultConcurrency is --concurrency's default (docs/benchmarks.md, "dagtrigger against the Airflow
// API driven directly"; the sitting in docs/benchmarks-history.md, "Per-key concurrency").
const defaultConcurrency = 16

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	fs := flag.NewFlagSet("dagtrigger", flag.ContinueOnError)
	// Each event costs one Airflow request inside its transaction: small batches.
	o.Register(fs, service.Flags{Group: "dagtrigger", Partitions: 3, Schema: pg.DefaultSchema, MaxAttempts: 5, BatchSize: 20, Concurrency: defaultConcurrency}, "event")
	fs.Lookup("concurrency").Usage += "; the default, 16, measured against a stand-in answering in 200 ms: 6 partitions reached 318 runs/s at 16, 368 at 32 and 599 at 64 (29 at 1; docs/benchmarks.md); the Airflow call runs before the transaction and holds no pooled connection"
	fs.StringVar(&o.airflowURL, "airflow-url", "", "base URL of the Airflow API server, http://host:8080 (required); /api/v2/dags/{dag_id}/dagRuns is appended")
	fs.StringVar(&o.dagID, "dag-id", "", "DAG to start one run of per event (this or --asset)")
	fs.StringVar(&o.asset, "asset", "", "instead of --dag-id: the asset (Airflow's asset name) to create one asset event of per event, its extra carrying kafkatx_id (unique per event, stable across retries and crashes) and the row; DAGs scheduled on the asset run as Airflow's asset scheduling decides (several queued events may start one run)")
	fs.StringVar(&o.tokenFile, "airflow-token-file", "", "file holding a bearer token for Airflow, re-read per request and after a 401; without it (or a username) no Authorization header is sent")
	fs.StringVar(&o.username, "airflow-username", "", "Airflow user whose password (--airflow-password-file) is exchanged for tokens at POST /auth/token, refreshed before they expire")
	fs.StringVar(&o.passwordFile, "airflow-password-file", "", "file holding --airflow-username's password, re-read at each token exchange")
	fs.DurationVar(&o.waitMax, "airflow-wait-max", kafkatx.DefaultUnavailableMaxWait, "how long a partition waits for Airflow (refused credentials, Airflow down) for one event, outside any transaction, before the event's tries count as attempts (a DAG or asset not found waits without this bound)")
	fs.DurationVar(&o.airflowTimeout, "airflow-timeout", 10*time.Second, "timeout of one request to Airflow, from when it holds a permit of the call limit (time waiting for a permit does not count)")
	fs.IntVar(&o.minCalls, "airflow-min-calls", limit.DefaultMin, "lowest limit of requests in flight to Airflow over the whole process (1 to 4096); the limit adapts between --airflow-min-calls and --airflow-max-calls to Airflow's latency and errors")
	fs.IntVar(&o.maxCalls, "airflow-max-calls", limit.DefaultMax, "highest limit of requests in flight to Airflow over the whole process (1 to 4096, at least --airflow-min-calls; equal to it: a fixed limit); a default Airflow 3.3.2 (one api-server worker, database pool 5 + 10) settles the adaptive limit at a few, a far side answering in constant time lets it grow to this")
	o.paused.register(fs)
	fs.DurationVar(&o.keyRetention, "key-retention", 7*24*time.Hour, "how long an event's source position is remembered to skip re-published copies")
	fs.StringVar(&o.cdcOps, "cdc-ops", "c,u,d,r", "Debezium ops that start a run, comma-separated: c (create), u (update), d (delete), r (snapshot read), t (truncate), m (logical message); others are skipped and counted")
	fs.StringVar(&o.deleteBefore, "cdc-delete-before", "key", "a delete's conf.before: key (only the record key's columns; the others are placeholders under PostgreSQL's default replica identity) or full (the whole before image, for REPLICA IDENTITY FULL tables)")
	if code, ok := flagcheck.Parse(fs, os.Args[1:]); !ok {
		return code
	}
	o.FromEnv()
	if err := flagcheck.First(
		flagcheck.Duration("airflow-wait-max", o.waitMax, time.Second, 30*24*time.Hour),
		flagcheck.Duration("airflow-timeout", o.airflowTimeout, 100*time.Millisecond, 10*time.Minute),
		flagcheck.Duration("key-retention", o.keyRetention, time.Minute, 365*24*time.Hour),
		flagcheck.Int("airflow-min-calls", o.minCalls, 1, 4096),
		flagcheck.Int("airflow-max-calls", o.maxCalls, max(1, o.minCalls), 4096),
		o.Check(),
		o.paused.check(),
		flagcheck.NonEmpty("airflow-url", o.airflowURL, "the Airflow API server's base URL, http://host:8080"),
		checkTarget(o.dagID, o.asset),
		checkAirflowURL(o.airflowURL),
		checkDAGID(o.dagID),
		checkOps(o.cdcOps),
		checkDeleteBefore(o.deleteBefore),
		checkTokenFile("airflow-token-file", o.tokenFile),
		checkTokenFile("airflow-password-file", o.passwordFile),
	); err != nil {
		fmt.Fprintln(os.Stderr, "dagtrigger:", err)
		return 2
	}
	if err := o.LoadKafkaConfigFile(); err != nil {
		fmt.Fprintln(os.Stderr, "dagtrigger:", err)
		return 2
	}

	log := service.Logger()
	defer log.Sync() //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, o, log); err != nil {
		fmt.Fprintln(os.Stderr, "dagtrigger:", service.SessionRefusal(err))
		return 1
	}
	return 0
}

func serve(ctx context.Context, o options, log *zap.Logger) error {
	switch {
	case o.Brokers == "":
		return errors.New("no brokers: pass --brokers host:port or set KAFKA_BOOTSTRAP_SERVERS")
	case o.DatabaseURL == "":
		return errors.New("no database: pass --database-url postgres://user:pass@host:port/db or set DATABASE_URL")
	case o.Topic == "":
		return errors.New("--topic is required")
	case o.airflowURL == "":
		return errors.New("--airflow-url is required (the Airflow API server's base URL)")
	case (o.dagID == "") == (o.asset == ""):
		return errors.New("exactly one of --dag-id and --asset is required")
	case o.deleteBefore != "key" && o.deleteBefore != "full":
		return fmt.Errorf("--cdc-delete-before %q: want key or full", o.deleteBefore)
	}
	ops, err := parseOps(o.cdcOps)
	if err != nil {
		return err
	}
	calls, err := limit.New(limit.Config{Min: o.minCalls, Max: o.maxCalls})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	af, err := airflow.New(airflow.Config{
		BaseURL:        o.airflowURL,
		TokenFile:      o.tokenFile,
		Username:       o.username,
		PasswordFile:   o.passwordFile,
		RequestTimeout: o.airflowTimeout,
		// One idle connection per unit that may call at once, so concurrent calls reuse them.
		HTTPClient: &http.Client{Timeout: o.airflowTimeout, Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConns: 1024, MaxIdleConnsPerHost: min(1024, o.Concurrency*o.Partitions*2), IdleConnTimeout: 90 * time.Second}},
		// A few quick tries inside the event's transaction; longer outages are waited out by
		// the consumer outside it (Unavailable).
		MaxAttempts: 3,
		MaxBackoff:  time.Second,
		Logger:      log,
		Limiter:     calls, // every request of the process, whatever its partition and lane
		DAGState:    o.paused.config(reg),
	})
	if err != nil {
		return err
	}
	// --metrics-addr answers while the topics and the database are waited for.
	probes, err := service.StartProbes(o.MetricsAddr, reg)
	if err != nil {
		return err
	}
	defer probes.Close()
	probes.Stage("creating the topics")
	base := o.ClientConfig()
	if err := topics.Ensure(ctx, log, base, []string{o.Topic, o.Topic + ".dlq"}, o.Partitions, 1, nil, 30*time.Second); err != nil {
		return err
	}
	probes.Stage("waiting for the database")
	pools, err := o.OpenPools(ctx, log)
	if err != nil {
		return err
	}
	defer pools.Close()
	pool := pools.Pool
	probes.Stage("applying the migrations")
	// A session-level lock: on the session pool (--session-database-url).
	if err := kafkatx.Migrate(ctx, pools.Session, o.Schema); err != nil {
		return err
	}

	t := &trigger{
		pool:       pool,
		airflow:    af,
		dagID:      o.dagID,
		asset:      o.asset,
		group:      o.Group,
		schema:     o.Schema,
		scope:      scope(o.Group, o.dagID, o.asset),
		retention:  o.keyRetention,
		log:        log.Named("dagtrigger"),
		ops:        ops,
		fullBefore: o.deleteBefore == "full",
	}
	cfg := o.ConsumerConfig(log, reg)
	cfg.UnavailableMaxWait = o.waitMax
	// The Airflow call runs inside the consumer's transaction: the idle bound must outlast it.
	cfg.Transaction.IdleTimeout = max(10*time.Second, o.airflowTimeout+5*time.Second)
	cfg.SkipMigrations = true // applied above
	cfg.Prepare = t.prepare   // the Airflow call, before the transaction
	// The Airflow client limits each of its requests (--airflow-max-calls); a second limit on
	// whole Prepare calls (a batch of events each) would only measure the first one's queue.
	cfg.PrepareLimit = limit.Fixed(kafkatx.MaxUnitsDefault)
	c, err := kafkatx.NewConsumer(pool, t.handle, cfg)
	if err != nil {
		return err
	}
	// A paused DAG (or one Airflow does not know) is noted on /readyz; it keeps the service
	// ready: a restart would not unpause it (--when-paused hold: its partitions are listed
	// as waiting, like any dependency reported Unavailable).
	c.AddReadinessNote("airflow", func(context.Context) string { return af.ReadinessNote() })
	go logLimit(ctx, log, calls)
	err = service.Run(ctx, service.Options{Pool: pool, Consumer: c, Brokers: o.Brokers, Schema: o.Schema,
		KafkaConfig: o.ClientConfig(), Session: pools.Session.Config().ConnConfig, ExitWhenIdle: o.ExitWhenIdle, Group: o.Group, Topic: o.Topic, Logger: log, Registry: reg, MetricsAddr: o.MetricsAddr, Probes: probes})
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
		"airflow_waits":   s.Unavailable,
		"not_changes":     t.notChanges.Load(),
		"ops_skipped":     t.opsSkipped.Load(),
		"airflow_limit":   int64(calls.Limit()),
	})
	fmt.Println(string(b))
	return err
}

// logLimit logs the limit on requests to Airflow at info level every 10 s while it changes.
func logLimit(ctx context.Context, log *zap.Logger, l *limit.Limiter) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	last := -1
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if n := l.Limit(); n != last {
			last = n
			log.Info("requests to Airflow in flight", zap.Int("limit", n), zap.Int("in_flight", l.InFlight()), zap.Int("waiting", l.Waiting()))
		}
	}
}

// parseOps parses --cdc-ops.
func parseOps(s string) (map[string]bool, error) {
	ops := map[string]bool{}
	for _, op := range strings.Split(s, ",") {
		op = strings.TrimSpace(op)
		switch op {
		case "c", "u", "d", "r", "t", "m":
			ops[op] = true
		case "":
		default:
			return nil, fmt.Errorf("--cdc-ops: unknown op %q (want c, u, d, r, t or m)", op)
		}
	}
	if len(ops) == 0 {
		return nil, errors.New("--cdc-ops names no op")
	}
	return ops, nil
}

// checkAirflowURL refuses an --airflow-url that is not an http(s) URL with a host, before
// anything connects (exit 2).
func checkAirflowURL(s string) error {
	if s == "" {
		return nil // NonEmpty says so
	}
	// The URL is never quoted back: it may carry a password.
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("--airflow-url: want the Airflow API server's http(s) base URL, http://host:8080")
	}
	if u.User != nil {
		return errors.New("--airflow-url: credentials in the URL are refused (they would show in process lists and logs): pass --airflow-token-file, or --airflow-username and --airflow-password-file")
	}
	return nil
}

// checkDAGID refuses a --dag-id Airflow cannot hold or that would not stay one segment of the
// API's URL (airflow.ValidateDAGID).
func checkDAGID(id string) error {
	if id == "" {
		return nil // NonEmpty says so
	}
	if err := airflow.ValidateDAGID(id); err != nil {
		return fmt.Errorf("--dag-id: %w", err)
	}
	return nil
}

// checkTarget refuses anything but exactly one of --dag-id and --asset.
func checkTarget(dagID, asset string) error {
	switch {
	case dagID == "" && asset == "":
		return errors.New("--dag-id or --asset is required: the DAG to start one run of per event, or the asset to create one event on per event")
	case dagID != "" && asset != "":
		return errors.New("--dag-id and --asset exclude each other: pass one (a run of the DAG per event, or an event on the asset per event)")
	case asset != "" && strings.TrimSpace(asset) != asset:
		return fmt.Errorf("--asset %q: leading or trailing white space", asset)
	}
	return nil
}

// scope is the idempotency scope of the events' keys: per group and target.
func scope(group, dagID, asset string) string {
	if asset != "" {
		return "dagtrigger/" + group + "/asset:" + asset
	}
	return "dagtrigger/" + group + "/" + dagID
}

// checkOps refuses a --cdc-ops parseOps would refuse.
func checkOps(s string) error {
	_, err := parseOps(s)
	return err
}

// checkDeleteBefore refuses a --cdc-delete-before other than key or full.
func checkDeleteBefore(s string) error {
	if s != "key" && s != "full" {
		return fmt.Errorf("--cdc-delete-before %q: want key or full", s)
	}
	return nil
}

// checkTokenFile refuses a secret file (--airflow-token-file, --airflow-password-file) that
// cannot be read, before anything connects (the file is read again at each use: a rotated
// file is followed). The password file was accepted unread (a second fresh-eyes attack).
func checkTokenFile(flag, path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	return f.Close()
}
