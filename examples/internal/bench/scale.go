package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/kafkatx/kafkatx/outbox"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/pg"
)

// scaleRow is one scale-out run: procs processes of examples/orders in one group.
type scaleRow struct {
	Procs      int     `json:"procs"`
	Events     bool    `json:"events"` // false: drain without events; true: end to end
	Messages   int64   `json:"messages"`
	Counted    int64   `json:"counted"` // orders applied inside the timed window
	Seconds    float64 `json:"seconds"` // the timed window
	Rate       float64 `json:"msgs_per_s"`
	VsDrain    float64 `json:"vs_drain,omitempty"` // end to end / drain at the same count
	Stable     bool    `json:"group_stable"`       // the window started with all procs in a stable group
	StartupSec float64 `json:"startup_s"`          // process start to the window's start
	PeakBack   int64   `json:"peak_backlog,omitempty"`
	// CPU in cores (CPU seconds over the window's seconds): each orders process, the whole
	// PostgreSQL server (postmaster and every child: backends, WAL writer, checkpointer,
	// autovacuum), the broker, and the machine's busy share of all its CPUs (/proc/stat).
	OrdersCores  []float64 `json:"orders_cores"`
	PGCores      float64   `json:"pg_cores"`
	BrokerCores  float64   `json:"broker_cores"`
	MachineCores float64   `json:"machine_busy_cores"`
	NProc        int       `json:"nproc"`
	Load1        float64   `json:"load1"`
	// PeakRSSMB is each process's VmHWM (/proc/<pid>/status) at the end of the run: the
	// binary's own peak, start-up included.
	PeakRSSMB []float64 `json:"peak_rss_mb"`
}

// scaleOut runs -scale's process counts, each without events (drain) and with them (end to
// end), each over -scale-messages orders on a fresh -scale-partitions topic, database and
// group.
func (b *bench) scaleOut(ctx context.Context) error {
	if b.o.scale == "" {
		return nil
	}
	var counts []int
	for _, f := range strings.Split(b.o.scale, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-scale %q: want process counts like 1,2,3", b.o.scale)
		}
		counts = append(counts, n)
	}
	bin := b.o.ordersBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "kafkatx-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "orders")
		// By import path: examples/ is a module of its own, and the bench runs inside it.
		progress("scale: go build -o %s github.com/kafkatx/kafkatx/examples/orders", bin)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kafkatx/kafkatx/examples/orders")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build examples/orders (run the bench inside examples/, its module: make bench; or pass -orders-bin): %w", err)
		}
	}
	logs, err := os.MkdirTemp("", "kafkatx-bench-scale-")
	if err != nil {
		return err
	}
	progress("scale: the processes' logs go to %s", logs)
	pgPID := listenerPID(dbPort(b.o.databaseURL))
	for _, k := range counts {
		var drain float64
		for _, events := range []bool{false, true} {
			x, err := b.scaleRun(ctx, bin, logs, k, events, pgPID)
			if err != nil {
				return fmt.Errorf("%d processes, events %v: %w", k, events, err)
			}
			if !events {
				drain = x.Rate
			} else if drain > 0 {
				x.VsDrain = x.Rate / drain
			}
			b.rep.Scale = append(b.rep.Scale, x)
		}
	}
	return nil
}

// scaleRun starts k processes of examples/orders on a fresh, empty topic in a fresh group and
// database, waits until the group is stable with all k members, produces the backlog in one
// Kafka transaction, and times from its commit until every order is applied and, with
// events, every event is on the events topic and the outbox holds no pending row. Every
// order is counted and every process has its share from the start, and no producer runs in
// the window. (A backlog produced before the processes started was mostly drained by the
// first member while the others joined — the broker's group.initial.rebalance.delay.ms is 0
// here — and the window measured the rest with the machine half idle; one produced inside
// the window paced the drain.)
func (b *bench) scaleRun(ctx context.Context, bin, logs string, k int, events bool, pgPID int) (scaleRow, error) {
	x := scaleRow{Procs: k, Events: events, Messages: int64(b.o.scaleMessages), NProc: numCPU(), Load1: loadAvg()[0]}
	mode := "drain"
	if events {
		mode = "e2e"
	}
	name := fmt.Sprintf("scale-%d-%s", k, mode)
	db := fmt.Sprintf("%s_%d%s", b.db, k, mode)
	if _, err := b.base.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return x, fmt.Errorf("create database %s: %w", db, err)
	}
	defer dropDatabase(context.WithoutCancel(ctx), b.base, db)
	pollURL, err := databaseURL(b.o.databaseURL, db, "kafkatx-bench/"+name+"-poll")
	if err != nil {
		return x, err
	}
	pool, err := pgxpool.New(ctx, pollURL)
	if err != nil {
		return x, err
	}
	defer pool.Close()
	group := "bench-" + name + "-" + b.suffix
	topic := "bench-" + name + "-" + b.suffix
	b.topics = append(b.topics, topic, topic+".dlq")
	if err := createTopics(ctx, b.o.brokers, []string{topic, topic + ".dlq"}, b.o.scalePartitions); err != nil {
		return x, err
	}
	eventsTopic := ""
	var wm *watermarks
	if events {
		eventsTopic = "bench-" + name + "-events-" + b.suffix
		b.topics = append(b.topics, eventsTopic)
		if err := createTopics(ctx, b.o.brokers, []string{eventsTopic}, b.o.scalePartitions); err != nil {
			return x, err
		}
		if wm, err = newWatermarks(b.o.brokers, eventsTopic, b.o.scalePartitions); err != nil {
			return x, err
		}
		defer wm.close()
	}
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": b.o.brokers})
	if err != nil {
		return x, err
	}
	defer admin.Close()

	progress("%s: %d processes of examples/orders, group %s, events topic %q", name, k, group, eventsTopic)
	started := time.Now()
	var procs []*exec.Cmd
	exited := make(chan struct{}, k) // one token per process that ended
	var waits []chan struct{}
	defer func() { stopProcs(procs, waits) }()
	for i := range k {
		u, err := databaseURL(b.o.databaseURL, db, fmt.Sprintf("kafkatx-bench/%s-%d", name, i))
		if err != nil {
			return x, err
		}
		out, err := os.Create(filepath.Join(logs, fmt.Sprintf("%s-%d.log", name, i)))
		if err != nil {
			return x, err
		}
		defer out.Close()
		cmd := exec.Command(bin, "--brokers", b.o.brokers, "--database-url", u, "--topic", topic, "--group", group,
			"--partitions", strconv.Itoa(b.o.scalePartitions), "--events-topic", eventsTopic)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			return x, err
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done); exited <- struct{}{} }()
		procs, waits = append(procs, cmd), append(waits, done)
	}

	type snap struct {
		at                time.Time
		orders            []time.Duration
		pg, broker        time.Duration
		busy, total, done int64
	}
	take := func(applied int64) snap {
		s := snap{at: time.Now(), done: applied}
		for _, c := range procs {
			d, _ := procCPU(c.Process.Pid)
			s.orders = append(s.orders, d)
		}
		s.pg, _ = treeCPU(pgPID)
		s.broker, _ = procCPU(b.broker)
		s.busy, s.total = machineCPU()
		return s
	}
	// Every member joined (on an empty topic), then the backlog.
	joinBy := time.Now().Add(2 * time.Minute)
	for !groupStable(ctx, admin, group, k) {
		if time.Now().After(joinBy) {
			return x, fmt.Errorf("the group did not become stable with %d members within 2 minutes (logs in %s)", k, logs)
		}
		select {
		case <-exited:
			return x, fmt.Errorf("a process exited early (logs in %s)", logs)
		case <-ctx.Done():
			return x, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	x.Stable = true
	// The backlog in one Kafka transaction: produced while the members wait (they read
	// committed and see nothing), visible to all of them at the commit, which starts the
	// window.
	pr, err := newTxProducer(ctx, b.o.brokers, topic, "bench-"+name+"-"+b.suffix)
	if err != nil {
		return x, err
	}
	t0 := time.Now()
	if err := pr.backlog(ctx, int(x.Messages)); err != nil {
		pr.close()
		return x, err
	}
	progress("%s: produced %d orders in one transaction in %s", name, x.Messages, time.Since(t0).Round(time.Millisecond))
	start := take(0)
	err = pr.commit(ctx)
	pr.close()
	if err != nil {
		return x, err
	}
	var end *snap
	deadline := time.Now().Add(15 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end == nil {
		select {
		case <-ctx.Done():
			return x, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return x, fmt.Errorf("not done within 15 minutes (logs in %s)", logs)
		}
		select {
		case <-exited:
			return x, fmt.Errorf("a process exited early (logs in %s)", logs)
		default:
		}
		var applied int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(orders), 0)::bigint FROM customer_totals`).Scan(&applied); err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42P01" { // undefined_table: not migrated yet
				return x, err
			}
		}
		if applied >= x.Messages {
			if !events {
				s := take(applied)
				end = &s
				break
			}
		}
		if events {
			pub, err := wm.count()
			if err != nil {
				return x, err
			}
			x.PeakBack = max(x.PeakBack, applied-pub)
			if applied >= x.Messages && pub >= x.Messages {
				var pending int64
				if err := pool.QueryRow(ctx, `SELECT coalesce(sum(pack_count), 0) FROM `+outbox.Table(pg.DefaultSchema)+` WHERE state IN ('pending', 'parked', 'packed')`).Scan(&pending); err != nil {
					return x, err
				}
				if pending == 0 {
					s := take(applied)
					end = &s
				}
			}
		}
	}
	for _, c := range procs {
		x.PeakRSSMB = append(x.PeakRSSMB, round3(procStatusMB(strconv.Itoa(c.Process.Pid), "VmHWM:")))
	}
	x.StartupSec = start.at.Sub(started).Seconds()
	x.Seconds = end.at.Sub(start.at).Seconds()
	x.Counted = x.Messages - start.done
	if x.Seconds > 0 {
		x.Rate = float64(x.Counted) / x.Seconds
		for i := range procs {
			x.OrdersCores = append(x.OrdersCores, round3((end.orders[i]-start.orders[i]).Seconds()/x.Seconds))
		}
		x.PGCores = round3((end.pg - start.pg).Seconds() / x.Seconds)
		x.BrokerCores = round3((end.broker - start.broker).Seconds() / x.Seconds)
		if dt := end.total - start.total; dt > 0 {
			x.MachineCores = round3(float64(end.busy-start.busy) / float64(dt) * float64(x.NProc))
		}
	}
	progress("%s: %.0f msgs/s (%d orders in %.2fs, group stable %v); cores: orders %v, PostgreSQL %.2f, broker %.2f, machine busy %.2f of %d; peak RSS MB %v",
		name, x.Rate, x.Counted, x.Seconds, x.Stable, x.OrdersCores, x.PGCores, x.BrokerCores, x.MachineCores, x.NProc, x.PeakRSSMB)
	return x, nil
}

// groupStable reports whether group is Stable with want members (an error: not yet).
func groupStable(ctx context.Context, admin *kafka.AdminClient, group string, want int) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := admin.DescribeConsumerGroups(ctx, []string{group})
	if err != nil || len(res.ConsumerGroupDescriptions) != 1 {
		return false
	}
	d := res.ConsumerGroupDescriptions[0]
	return d.Error.Code() == kafka.ErrNoError && d.State == kafka.ConsumerGroupStateStable && len(d.Members) == want
}

// stopProcs sends SIGTERM to each process and waits (waits[i] closes when procs[i] ended)
// up to 60 s, then kills it.
func stopProcs(procs []*exec.Cmd, waits []chan struct{}) {
	for _, c := range procs {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for i, c := range procs {
		select {
		case <-waits[i]:
		case <-time.After(60 * time.Second):
			_ = c.Process.Kill()
			<-waits[i]
		}
	}
}

// databaseURL is the postgres:// URL u with database db and application_name app.
func databaseURL(u, db, app string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") {
		return "", fmt.Errorf("-scale needs a postgres:// URL for -database-url")
	}
	p.Path = "/" + db
	q := p.Query()
	q.Set("application_name", app)
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// dbPort is the port of a postgres:// URL (5432 when absent), or "".
func dbPort(u string) string {
	cfg, err := pgconn.ParseConfig(u)
	if err != nil {
		return ""
	}
	return strconv.Itoa(int(cfg.Port))
}

// dropDatabase drops db, trying again for a few seconds: WITH (FORCE) may not end an
// autovacuum worker that is on it (a non-superuser may not signal it), which soon ends by
// itself. A failure is reported, not fatal.
func dropDatabase(ctx context.Context, base *pgxpool.Pool, db string) {
	var err error
	for range 10 {
		if _, err = base.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	progress("drop database %s: %v", db, err)
}
