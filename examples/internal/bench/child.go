package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"net/http"
	_ "net/http/pprof" // KAFKATX_BENCH_PPROF
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/pg"
)

// spec is what the parent asks one child process to measure. Each phase runs in its own
// child, so the child's peak RSS (getrusage's ru_maxrss, read by the parent) is that phase's
// alone, and producing (done by the parent) does not count against the consumer.
type spec struct {
	Phase       string            `json:"phase"` // ceiling, naive, kafkatx, relay
	Name        string            `json:"name"`  // row label, also the PostgreSQL application_name suffix
	DatabaseURL string            `json:"database_url"`
	Database    string            `json:"database"`
	Brokers     string            `json:"brokers"`
	Schema      string            `json:"schema"`
	Topic       string            `json:"topic"`
	EventsTopic string            `json:"events_topic"`
	Group       string            `json:"group"`
	Batch       int               `json:"batch"`
	Messages    int               `json:"messages"`   // backlog to drain
	WithRelay   bool              `json:"with_relay"` // kafkatx: relay in-process, as examples/orders runs it
	Seconds     float64           `json:"seconds"`    // ceiling: duration of each variant
	Conns       int               `json:"conns"`      // ceiling: connections
	CPUProfile  string            `json:"cpu_profile"`
	KafkaExtra  map[string]string `json:"kafka_extra,omitempty"`     // kafkatx: extra librdkafka settings
	Timeout     float64           `json:"timeout"`                   // seconds
	Partitions  int               `json:"partitions,omitempty"`      // pipeline: of the events topic
	Events      bool              `json:"events,omitempty"`          // pipeline: one event per applied order
	MaxOutbox   int               `json:"max_outbox_rows,omitempty"` // pipeline: examples/orders' --max-outbox-rows (0: none)
	SampleEvery float64           `json:"sample_every,omitempty"`    // pipeline (soak): seconds between samples
}

func (s spec) app() string { return "kafkatx-bench/" + s.Name }

// event is one JSON line a child writes on stdout.
type event struct {
	Event string `json:"event"` // drained, result, error
	Error string `json:"error,omitempty"`

	// Drain of the backlog: messages committed from the first commit to the one that
	// reached Messages, excluding the first commit's own messages (as 05-throughput does).
	Messages   int64       `json:"messages,omitempty"`
	FirstN     int64       `json:"first_n,omitempty"`
	Seconds    float64     `json:"seconds,omitempty"`
	Rate       float64     `json:"rate,omitempty"`
	ProcCPU    float64     `json:"proc_cpu_s,omitempty"` // this process, start to drained
	PGCPU      float64     `json:"pg_cpu_s,omitempty"`   // its PostgreSQL backends, start to drained
	GoHeapMB   float64     `json:"go_sys_mb,omitempty"`  // Go runtime's memory from the OS at drained
	Latency    int         `json:"latency_n,omitempty"`  // latency samples
	P50        float64     `json:"p50_ms"`               // produce -> commit, stamped messages
	P99        float64     `json:"p99_ms"`
	MaxMs      float64     `json:"max_ms,omitempty"`      //
	Variants   []cell      `json:"variants,omitempty"`    // ceiling
	StartupSec float64     `json:"startup_s,omitempty"`   // child start to first commit
	PeakRSSMB  float64     `json:"peak_rss_mb,omitempty"` // VmHWM when the event was written
	Batches    int64       `json:"batches,omitempty"`     // kafkatx: batch transactions committed
	BatchSec   float64     `json:"batch_s,omitempty"`     // kafkatx: their total time, all partitions
	Relay      *relaySteps `json:"relay,omitempty"`       // pipeline: the in-process relay's rounds
	Extra      string      `json:"note,omitempty"`

	// Pipeline phases.
	AppliedSec  float64 `json:"applied_s,omitempty"`    // first commit to the last order applied
	PeakBacklog int64   `json:"peak_backlog,omitempty"` // most orders committed and not yet published
	RSSMB       float64 `json:"rss_mb,omitempty"`       // sample: VmRSS
	OutboxRows  int64   `json:"outbox_rows,omitempty"`  // sample: pending outbox rows
	Published   int64   `json:"published,omitempty"`    // sample: records on the events topic
}

// cell is one ceiling variant's figures.
type cell struct {
	Name    string  `json:"name"`
	Rows    int64   `json:"rows"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	P50     float64 `json:"p50_ms"` // transaction time, begin to commit
	P99     float64 `json:"p99_ms"`
	PGCPU   float64 `json:"pg_cpu_s"`
	ProcCPU float64 `json:"proc_cpu_s"`
}

var emitMu sync.Mutex

// emit writes e as one line on stdout (from any goroutine).
func emit(e event) {
	e.PeakRSSMB = vmHWM()
	b, _ := json.Marshal(e)
	emitMu.Lock()
	defer emitMu.Unlock()
	fmt.Println(string(b))
}

// runChild runs one phase described by the JSON spec and reports on stdout.
func runChild(raw string) int {
	var s spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		emit(event{Event: "error", Error: "spec: " + err.Error()})
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(s.Timeout*float64(time.Second)))
		defer cancel()
	}
	if addr := os.Getenv("KAFKATX_BENCH_PPROF"); addr != "" {
		// Live profiles of the child (goroutines, blocking) while it runs, for investigations.
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
	var err error
	switch s.Phase {
	case "ceiling":
		err = runCeiling(ctx, s)
	case "naive", "kafkatx":
		err = runConsumer(ctx, s)
	case "relay":
		err = runRelay(ctx, s)
	case "pipeline":
		err = runPipeline(ctx, s)
	default:
		err = fmt.Errorf("unknown phase %q", s.Phase)
	}
	if err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

// childLogger writes warnings and errors to stderr, named for the phase.
func childLogger(name string) *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	cfg.OutputPaths, cfg.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	cfg.Sampling = nil
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l.Named("bench").With(zap.String("phase", name))
}

// openPool connects to the run's database with search_path set to the phase's schema (so
// the example's unqualified tables land there) and, when probe is set, the commit probe.
func openPool(ctx context.Context, s spec, schema string, probe *commitProbe, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pg.ParseConfig(s.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.ConnConfig.Database = s.Database
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = s.app()
	if probe != nil {
		cfg.ConnConfig.Tracer = probe
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	return pool, nil
}

// prepareOrders creates kafkatx's tables and the example's tables in the phase's schema.
func prepareOrders(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, order.SchemaSQL); err != nil {
		return fmt.Errorf("create order tables: %w", err)
	}
	return nil
}

// startProfile starts the CPU profile when asked; the returned func stops it (once).
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	done := false
	return func() {
		if !done {
			done = true
			pprof.StopCPUProfile()
			f.Close()
		}
	}, nil
}

// readLatencyCount reads from stdin the number of stamped messages the parent produced
// after the drain (0: none), and an optional second number.
func readLatencyCount(ctx context.Context) (int64, int64, error) {
	type res struct {
		a, b int64
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil {
			ch <- res{err: fmt.Errorf("read latency count: %w", err)}
			return
		}
		f := strings.Fields(line)
		var r res
		if len(f) > 0 {
			r.a, r.err = strconv.ParseInt(f[0], 10, 64)
		}
		if len(f) > 1 && r.err == nil {
			r.b, r.err = strconv.ParseInt(f[1], 10, 64)
		}
		ch <- r
	}()
	select {
	case r := <-ch:
		return r.a, r.b, r.err
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// waitFor polls cond every 2 ms until it holds, errc yields, or ctx ends.
func waitFor(ctx context.Context, errc <-chan error, what string, cond func() bool) error {
	return waitForEvery(ctx, errc, 2*time.Millisecond, what, cond)
}

// waitForEvery polls cond every every until it holds, errc yields, or ctx ends.
func waitForEvery(ctx context.Context, errc <-chan error, every time.Duration, what string, cond func() bool) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case err := <-errc:
			if err == nil {
				err = errors.New("stopped")
			}
			return fmt.Errorf("waiting for %s: consumer ended: %w", what, err)
		case <-t.C:
		}
	}
	return nil
}

// vmHWM is this process's peak resident set size in MiB (/proc/self/status VmHWM). It is read
// in the child rather than taken from wait4's ru_maxrss: Go starts children with
// clone(CLONE_VM|CLONE_VFORK), and Linux folds the parent's high-water mark into the child's
// ru_maxrss at exec.
func vmHWM() float64 { return procStatusMB("self", "VmHWM:") }

// vmRSS is this process's resident set size now in MiB (/proc/self/status VmRSS).
func vmRSS() float64 { return procStatusMB("self", "VmRSS:") }

// procStatusMB reads a kB field (VmRSS:, VmHWM:) of /proc/<pid>/status in MiB; 0 if absent.
func procStatusMB(pid, field string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

func goSysMB() float64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.Sys) / (1 << 20)
}
