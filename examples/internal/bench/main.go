// Command bench measures kafkatx against the PostgreSQL ceiling for the same writes and a
// naive hand-written loop, on the real broker and PostgreSQL, in one run (issue 6,
// docs/benchmarks.md). `make bench` runs it; `go -C examples run ./internal/bench -h` lists the flags.
//
// Phases, each in its own child process (so that its peak RSS is its own):
//  1. ceiling: PostgreSQL alone doing the order service's writes on 2 connections — through
//     examples/orders' handler and kafkatx's outbox table (100, 1000 and 5000 orders per
//     transaction), and as 05-throughput's pgbench script (plain tables, 100 and 1000);
//  2. naive: confluent-kafka-go with one transaction and one synchronous offset commit per
//     message;
//  3. kafkatx: kafkatx.NewBatchConsumer with examples/orders' handler, Batch.Size 1, 100,
//     1000 and 5000, and as examples/orders runs it (order.DefaultBatchSize with the relay
//     in-process and its garbage-collector setting);
//  4. relay: outbox/relay draining pre-filled outbox rows;
//  5. pipeline: the order service as examples/orders runs it (examples/internal/service, the
//     relay in-process): orders-noevents and e2e (consumed, applied and published, outbox
//     empty) on the same backlog, then produce -> effect and produce -> published latency at
//     -e2e-rate; opt-in: -e2e-backlog N (peak RSS with events), -soak D (samples every
//     -soak-every) and -scale 1,2,3 (processes of the examples/orders binary in one group).
//
// Consumers drain a backlog produced beforehand (msgs/s from the first commit to the last,
// start-up and group join excluded), then the parent produces stamped messages at an offered
// rate (-rate, at most 80% of the phase's drain rate) and the child times each one from its
// produce call to the return of the COMMIT that applied it (p50/p99). stdout gets a table and
// one JSON line; progress goes to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/examples/internal/topics"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/pg"
)

type options struct {
	databaseURL, brokers string
	partitions           int
	naive, batch1        int
	messages, relayRows  int
	ceilingSeconds       float64
	conns                int
	rate                 float64
	latencySeconds       float64
	orders               bool
	backlog, backlogBat  int
	only                 string
	profileDir           string
	keep                 bool
	kafkaExtra           string

	// Pipeline phases (issue 17).
	e2e                            bool
	e2eRate                        float64
	e2eBacklog                     int
	maxOutboxRows                  int
	soak, soakEvery                time.Duration
	soakRate                       float64
	scale, ordersBin               string
	scaleMessages, scalePartitions int
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-child" {
		os.Exit(runChild(os.Args[2]))
	}
	var o options
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL server (default $DATABASE_URL); a fresh database is created on it for the run and dropped after")
	fs.StringVar(&o.brokers, "brokers", os.Getenv("KAFKA_BOOTSTRAP_SERVERS"), "Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS); fresh topics per phase, deleted after")
	fs.IntVar(&o.partitions, "partitions", 3, "partitions of every topic (examples/orders' default)")
	fs.IntVar(&o.naive, "naive-messages", 5000, "backlog drained by the naive loop")
	fs.IntVar(&o.batch1, "batch1-messages", 2000, "backlog drained by kafkatx with Batch.Size 1")
	fs.IntVar(&o.messages, "messages", 100000, "backlog drained by kafkatx with Batch.Size >= 100")
	fs.IntVar(&o.relayRows, "relay-rows", 100000, "outbox rows pre-filled for the relay")
	fs.Float64Var(&o.ceilingSeconds, "ceiling-seconds", 5, "duration of each PostgreSQL ceiling variant, seconds")
	fs.IntVar(&o.conns, "ceiling-conns", 2, "connections of the PostgreSQL ceiling")
	fs.Float64Var(&o.rate, "rate", 5000, "offered load for the latency measurement, msgs/s (capped at 80% of each phase's drain rate)")
	fs.Float64Var(&o.latencySeconds, "latency-seconds", 5, "duration of the offered load, seconds (0: no latency measurement)")
	fs.BoolVar(&o.orders, "orders", true, "also run kafkatx as examples/orders does: order.DefaultBatchSize with the relay in-process")
	fs.IntVar(&o.backlog, "backlog", 0, "also drain a backlog of N messages (e.g. 1000000) with kafkatx and report its peak RSS (slow: off by default)")
	fs.IntVar(&o.backlogBat, "backlog-batch", 500, "Batch.Size for -backlog")
	fs.BoolVar(&o.e2e, "e2e", true, "run the pipeline pair as examples/orders runs (order.DefaultBatchSize, relay in-process, its GC setting): orders-noevents (no events) and e2e (one event per order, timed until all are published and the outbox is empty), then the offered load at -e2e-rate on e2e")
	fs.IntVar(&o.maxOutboxRows, "max-outbox-rows", service.DefaultMaxOutboxRows, "the pipeline phases' --max-outbox-rows, as examples/orders (0: no bound)")
	fs.Float64Var(&o.e2eRate, "e2e-rate", 10000, "offered load on the e2e phase with the relay running, msgs/s (not capped), for -latency-seconds: produce -> effect and produce -> published")
	fs.IntVar(&o.e2eBacklog, "e2e-backlog", 0, "also drain N orders (e.g. 1000000) as e2e does, with events, for the example's peak RSS (off by default)")
	fs.DurationVar(&o.soak, "soak", 0, "also run a soak of this long (e.g. 10m) at -soak-rate with the relay running (off by default)")
	fs.Float64Var(&o.soakRate, "soak-rate", 5000, "offered load of the soak, msgs/s")
	fs.DurationVar(&o.soakEvery, "soak-every", 10*time.Second, "the soak's sampling interval: RSS, p99 of the window (both latencies), outbox backlog")
	fs.StringVar(&o.scale, "scale", "", "also run the scale-out: comma-separated counts of examples/orders processes in one group (e.g. 1,2,3), each drained without and with events (off by default)")
	fs.IntVar(&o.scaleMessages, "scale-messages", 300000, "orders in the scale-out's backlog")
	fs.IntVar(&o.scalePartitions, "scale-partitions", 6, "partitions of the scale-out's topics")
	fs.StringVar(&o.ordersBin, "orders-bin", "", "examples/orders binary for -scale (default: go build github.com/kafkatx/kafkatx/examples/orders, run inside examples/, its module)")
	fs.StringVar(&o.only, "only", "", "comma-separated phases to run (ceiling,naive,kafkatx-1,kafkatx-100,kafkatx-1000,kafkatx-5000,orders,relay,backlog,e2e,e2e-backlog,soak,scale); default all that are on")
	fs.StringVar(&o.profileDir, "cpuprofile-dir", "", "write a CPU profile (pprof) of each phase's drain to DIR/<phase>.pprof")
	fs.BoolVar(&o.keep, "keep", false, "keep the database and topics")
	fs.StringVar(&o.kafkaExtra, "kafka-config", "", "extra librdkafka settings for the kafkatx consumer, k=v,k=v (for tuning experiments)")
	_ = fs.Parse(os.Args[1:])
	if o.soakEvery <= 0 {
		fmt.Fprintln(os.Stderr, "bench: -soak-every must be positive")
		os.Exit(2)
	}
	if err := flagcheck.DatabaseURL("database-url", o.databaseURL); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rep, err := run(ctx, o)
	if rep != nil {
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, o options) (*report, error) {
	if o.databaseURL == "" || o.brokers == "" {
		return nil, errors.New("needs --database-url (or DATABASE_URL) and --brokers (or KAFKA_BOOTSTRAP_SERVERS); `make bench` starts both with scripts/dev-services")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, p := range strings.Split(o.only, ",") {
		if p = strings.TrimSpace(p); p != "" {
			want[p] = true
		}
	}
	on := func(p string) bool { return len(want) == 0 || want[p] }
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
	}

	if err := pg.CheckURL(o.databaseURL); err != nil {
		return nil, err
	}
	base, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer base.Close()
	dbName := fmt.Sprintf("kafkatx_bench_%d", time.Now().Unix())
	if _, err := base.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", dbName, err)
	}
	progress("database %s created", dbName)
	if !o.keep {
		defer dropDatabase(context.WithoutCancel(ctx), base, dbName)
	}
	cfg, err := pg.ParseConfig(o.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Database = dbName
	cfg.ConnConfig.RuntimeParams["application_name"] = "kafkatx-bench/parent"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	rep := newReport(ctx, base, o)
	b := &bench{o: o, self: self, db: dbName, base: base, pool: pool, rep: rep, broker: brokerPID(o.brokers), suffix: strconv.FormatInt(time.Now().Unix(), 36)}
	rep.KafkaVersion = brokerVersion(b.broker)
	b.pgPID = listenerPID(dbPort(o.databaseURL)) // the postmaster, when PostgreSQL runs here
	defer func() {
		if !o.keep {
			if err := deleteTopics(context.WithoutCancel(ctx), o.brokers, b.topics); err != nil {
				progress("delete topics: %v", err)
			}
		}
	}()

	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"ceiling", b.ceiling},
		{"naive", func(ctx context.Context) error { return b.consumer(ctx, "naive", "naive", 1, o.naive, false) }},
		{"kafkatx-1", func(ctx context.Context) error { return b.consumer(ctx, "kafkatx-1", "kafkatx", 1, o.batch1, false) }},
		{"kafkatx-100", func(ctx context.Context) error {
			return b.consumer(ctx, "kafkatx-100", "kafkatx", 100, o.messages, false)
		}},
		{"kafkatx-1000", func(ctx context.Context) error {
			return b.consumer(ctx, "kafkatx-1000", "kafkatx", 1000, o.messages, false)
		}},
		{"kafkatx-5000", func(ctx context.Context) error {
			return b.consumer(ctx, "kafkatx-5000", "kafkatx", 5000, o.messages, false)
		}},
		{"orders", func(ctx context.Context) error {
			if !o.orders && len(want) == 0 {
				return nil
			}
			return b.consumer(ctx, fmt.Sprintf("orders-%d+relay", order.DefaultBatchSize), "kafkatx", order.DefaultBatchSize, o.messages, true)
		}},
		{"relay", b.relay},
		{"backlog", func(ctx context.Context) error {
			if o.backlog <= 0 {
				return nil
			}
			return b.consumer(ctx, fmt.Sprintf("backlog-%d", o.backlog), "kafkatx", o.backlogBat, o.backlog, false)
		}},
		{"e2e", func(ctx context.Context) error {
			if !o.e2e && len(want) == 0 {
				return nil
			}
			return b.pipelinePair(ctx)
		}},
		{"e2e-backlog", b.e2eBacklog},
		{"soak", b.soak},
		{"scale", b.scaleOut},
	}
	for _, st := range steps {
		if !on(st.name) {
			continue
		}
		if err := st.run(ctx); err != nil {
			rep.finish()
			return rep, fmt.Errorf("%s: %w", st.name, err)
		}
	}
	rep.finish()
	return rep, nil
}

type bench struct {
	o      options
	self   string
	db     string
	base   *pgxpool.Pool // the server's DATABASE_URL database (CREATE/DROP DATABASE)
	pool   *pgxpool.Pool
	rep    *report
	broker int
	pgPID  int
	suffix string
	topics []string
}

func (b *bench) spec(phase, name string) spec {
	slug := strings.NewReplacer("+", "_", "-", "_").Replace(name)
	s := spec{Phase: phase, Name: name, DatabaseURL: b.o.databaseURL, Database: b.db, Brokers: b.o.brokers,
		Schema: "b_" + slug, Topic: "bench-" + name + "-" + b.suffix, EventsTopic: "bench-" + name + "-events-" + b.suffix,
		Group: "bench-" + name + "-" + b.suffix, Timeout: 1200, MaxOutbox: b.o.maxOutboxRows}
	s.Topic = strings.ReplaceAll(s.Topic, "+", "_")
	s.EventsTopic = strings.ReplaceAll(s.EventsTopic, "+", "_")
	if s.Phase == "kafkatx" && b.o.kafkaExtra != "" {
		s.KafkaExtra = map[string]string{}
		for _, kv := range strings.Split(b.o.kafkaExtra, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				s.KafkaExtra[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	if b.o.profileDir != "" {
		s.CPUProfile = fmt.Sprintf("%s/%s.pprof", b.o.profileDir, strings.ReplaceAll(name, "+", "_"))
	}
	return s
}

// child runs one phase's child process. onDrained, called when the child reports its drain,
// returns the line to send it (the count of stamped messages produced); it runs beside the
// reading of the child's lines, so that onSample, when set, gets the soak's samples as they
// come.
func (b *bench) child(ctx context.Context, s spec, r *row, onDrained func(event) (string, error), onSample func(event)) (result event, err error) {
	raw, _ := json.Marshal(s)
	cctx, kill := context.WithCancel(ctx)
	defer kill()
	cmd := exec.CommandContext(cctx, b.self, "-child", string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return event{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return event{}, err
	}
	r.Load1 = loadAvg()[0]
	brokerCPU0, _ := procCPU(b.broker)
	pgCPU0, pgOK := treeCPU(b.pgPID)
	busy0, total0 := machineCPU()
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return event{}, err
	}
	told := make(chan error, 1) // onDrained's outcome, once the line is sent
	telling := false
	defer func() {
		stdin.Close()
		werr := cmd.Wait()
		if err == nil && werr != nil {
			err = fmt.Errorf("child: %w", werr)
		}
	}()
	// failed prefers onDrained's error: a failure there kills the child, whose end is then
	// only its consequence.
	failed := func(err error) (event, error) {
		if telling {
			select {
			case terr := <-told:
				if terr != nil {
					return event{}, terr
				}
			default:
			}
		}
		return event{}, err
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return failed(fmt.Errorf("child said %q: %w", sc.Text(), err))
		}
		switch e.Event {
		case "error":
			return failed(errors.New(e.Error))
		case "drained":
			if c, ok := procCPU(b.broker); ok && b.broker != 0 {
				r.BrokerCPU = (c - brokerCPU0).Seconds()
			}
			if c, ok := treeCPU(b.pgPID); ok && pgOK && b.pgPID != 0 {
				r.PGServerCPU = (c - pgCPU0).Seconds()
			}
			if busy, total := machineCPU(); total > total0 {
				r.MachineBusy = round3(float64(busy-busy0) / float64(total-total0) * float64(numCPU()))
			}
			r.PhaseSec = time.Since(t0).Seconds()
			r.fromDrain(e)
			progress("%s: drained %d in %.2fs: %.0f msgs/s", s.Name, e.Messages, e.Seconds, e.Rate)
			if e.Batches > 0 {
				progress("%s: %d batch transactions, %.1f messages each, %.2fs in them (%.0f%% of %d partitions' time)", s.Name, e.Batches,
					float64(e.Messages)/float64(e.Batches), e.BatchSec, 100*e.BatchSec/(e.Seconds*float64(b.o.partitions)), b.o.partitions)
			}
			if rs := e.Relay; rs != nil {
				progress("%s: relay %d rounds: waiting for rows %.2fs, producing %.2fs, waiting for marks %.2fs", s.Name, rs.Rounds, rs.Read, rs.Produce, rs.MarkWait)
			}
			telling = true
			go func() {
				line, err := onDrained(e)
				if err == nil {
					if _, werr := io.WriteString(stdin, line+"\n"); werr != nil {
						err = fmt.Errorf("tell child: %w", werr)
					}
				}
				told <- err
				if err != nil {
					kill()
				}
			}()
		case "sample":
			if onSample != nil {
				onSample(e)
			}
		case "result":
			r.PeakRSSMB = e.PeakRSSMB
			_, _ = io.Copy(io.Discard, stdout)
			if telling { // the child read the line, so onDrained has returned
				if err := <-told; err != nil {
					return event{}, err
				}
			}
			return e, nil
		}
	}
	if err := sc.Err(); err != nil {
		return failed(err)
	}
	return failed(errors.New("child ended without a result"))
}

func (b *bench) ceiling(ctx context.Context) error {
	s := b.spec("ceiling", "ceiling")
	s.Seconds, s.Conns = b.o.ceilingSeconds, b.o.conns
	progress("ceiling: PostgreSQL alone, %d connections, %.0fs per variant", s.Conns, s.Seconds)
	var r row
	res, err := b.child(ctx, s, &r, nil, nil)
	if err != nil {
		return err
	}
	for _, v := range res.Variants {
		progress("ceiling %s: %.0f msgs/s", v.Name, v.Rate)
		b.rep.add(row{Name: "pg ceiling " + v.Name, Kind: "ceiling", Batch: atoiLast(v.Name), Messages: v.Rows, Rate: v.Rate,
			P50: v.P50, P99: v.P99, DrainSeconds: v.Seconds, ProcCPU: v.ProcCPU, PGCPU: v.PGCPU, PeakRSSMB: r.PeakRSSMB, Load1: r.Load1,
			Note: ceilingNotes[strings.Fields(v.Name)[0]]})
	}
	return nil
}

var ceilingNotes = map[string]string{
	"handler":       "examples/orders' handler, kafkatx's outbox table; latency = transaction time",
	"handler-plain": "the handler with a plain events table; latency = transaction time",
	"sql":           "05-throughput's pgbench SQL, plain tables; latency = transaction time",
}

func atoiLast(s string) int {
	f := strings.Fields(s)
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// consumer runs a naive or kafkatx phase: produce n messages, drain them in a child, then
// offer stamped messages at the latency rate.
func (b *bench) consumer(ctx context.Context, name, phase string, batch, n int, withRelay bool) error {
	s := b.spec(phase, name)
	s.Batch, s.Messages, s.WithRelay = batch, n, withRelay
	b.topics = append(b.topics, s.Topic, s.EventsTopic, s.Topic+".dlq")
	if err := createTopics(ctx, b.o.brokers, []string{s.Topic, s.EventsTopic, s.Topic + ".dlq"}, b.o.partitions); err != nil {
		return err
	}
	pr, err := newProducer(b.o.brokers, s.Topic)
	if err != nil {
		return err
	}
	defer pr.close()
	t0 := time.Now()
	if err := pr.backlog(ctx, n); err != nil {
		return err
	}
	progress("%s: produced %d in %s; draining (Batch.Size %d)", name, n, time.Since(t0).Round(time.Millisecond), batch)
	r := row{Name: name, Kind: phase, Batch: batch}
	if withRelay {
		r.Note = "relay in-process"
	}
	if n >= 1_000_000 {
		r.Note = "backlog drain, bounded memory"
	}
	res, err := b.child(ctx, s, &r, func(e event) (string, error) {
		if b.o.latencySeconds <= 0 || n >= 1_000_000 {
			return "0", nil
		}
		rate := b.offeredRate(e)
		r.Offered = rate
		sent, err := pr.paced(ctx, rate, time.Duration(b.o.latencySeconds*float64(time.Second)))
		if err != nil {
			return "", err
		}
		return strconv.Itoa(sent), nil
	}, nil)
	if err != nil {
		return err
	}
	r.fromResult(res)
	if r.LatencyN > 0 {
		progress("%s: latency at %.0f msgs/s offered: p50 %.1f ms, p99 %.1f ms (%d messages)", name, r.Offered, r.P50, r.P99, r.LatencyN)
	}
	progress("%s: peak RSS %.0f MB", name, r.PeakRSSMB)
	b.rep.add(r)
	return nil
}

// offeredRate is the latency phase's offered load after a drain reported in e: -rate, but at
// most 80% of the phase's drain rate, so the offered load never queues up by itself.
func (b *bench) offeredRate(e event) float64 {
	if e.Rate > 0 {
		return math.Min(b.o.rate, math.Floor(0.8*e.Rate))
	}
	return b.o.rate
}

func (b *bench) relay(ctx context.Context) error {
	s := b.spec("relay", "relay")
	s.Messages = b.o.relayRows
	b.topics = append(b.topics, s.EventsTopic)
	// LogAppendTime: a record's timestamp is when the broker appended it, the relay's latency's end.
	err := topics.Ensure(ctx, nil, kafka.ConfigMap{"bootstrap.servers": b.o.brokers}, []string{s.EventsTopic}, b.o.partitions, 1,
		map[string]string{"message.timestamp.type": "LogAppendTime"}, 30*time.Second)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fillOutbox(ctx, b.pool, s.Schema, s.EventsTopic, s.Messages); err != nil {
		return err
	}
	progress("relay: %d outbox rows written in %s; draining", s.Messages, time.Since(t0).Round(time.Millisecond))
	r := row{Name: "relay", Kind: "relay", Batch: 1000}
	res, err := b.child(ctx, s, &r, func(e event) (string, error) {
		if b.o.latencySeconds <= 0 {
			return "0", nil
		}
		rate := b.offeredRate(e)
		r.Offered = rate
		sent, err := paceOutbox(ctx, b.pool, s.Schema, s.EventsTopic, rate, time.Duration(b.o.latencySeconds*float64(time.Second)))
		if err != nil {
			return "", err
		}
		return strconv.Itoa(sent), nil
	}, nil)
	if err != nil {
		return err
	}
	r.fromResult(res)
	if r.Offered > 0 {
		lat, err := appendLatencies(ctx, b.o.brokers, s.EventsTopic, b.o.partitions)
		if err != nil {
			return fmt.Errorf("read back the relay's records: %w", err)
		}
		r.LatencyN, r.P50, r.P99, r.MaxMs = len(lat), quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	}
	r.Note = "latency: row INSERT -> broker append time"
	progress("relay: latency at %.0f rows/s offered: p50 %.1f ms, p99 %.1f ms; peak RSS %.0f MB", r.Offered, r.P50, r.P99, r.PeakRSSMB)
	b.rep.add(r)
	return nil
}
