package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/cmd/kafkalog"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/outbox/relays"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/retention"
)

// RelayCmd runs the outbox relay as a standalone sidecar process.
type RelayCmd struct {
	OutboxMode      string        `name:"outbox-mode" enum:"${outbox_modes}," default:"" help:"wal: publish the WAL outbox from its replication slot (exactly once, Kafka transactions); table: publish the outbox table's rows. Must match the mode stored with the schema (else exit 2); empty follows it (table for a new schema)."`
	HealthAddr      string        `name:"health-addr" env:"KAFKATX_HEALTH_ADDR" help:"Serve /healthz, /readyz and /metrics (Prometheus) on this host:port. Off when empty."`
	ExitWhenIdle    time.Duration `name:"exit-when-idle" help:"Exit 0 once the outbox has had no row waiting for this long (0: run until SIGTERM)."`
	Migrate         bool          `name:"migrate" help:"Apply kafkatx's migrations before starting (otherwise they must have been applied)."`
	BatchSize       int           `name:"batch-size" default:"${relay_batch_size}" help:"Records read, produced and marked per round (a packed row counts its records)."`
	PollInterval    time.Duration `name:"poll-interval" default:"${relay_poll_interval}" help:"Read the outbox this often when no NOTIFY arrives."`
	StandbyInterval time.Duration `name:"standby-interval" default:"${relay_standby_interval}" help:"A standby relay tries to take over this often."`
	LeaderTimeout   time.Duration `name:"leader-timeout" default:"${relay_leader_timeout}" help:"PostgreSQL ends the leader's session once it stays silent this long (idle_session_timeout), so a frozen leader (SIGSTOP, a paused VM) gives the leadership to a standby; a running leader touches it 4 times as often. Keep it above ${relay_read_timeout} (the read timeout)."`
	ShutdownTimeout time.Duration `name:"shutdown-timeout" default:"${relay_shutdown_timeout}" help:"On SIGTERM, wait this long for in-flight deliveries."`
	NoJanitor       bool          `name:"no-janitor" help:"Do not delete old rows (published outbox rows, attempts, resolved dead letters)."`
	KeepPublished   time.Duration `name:"keep-published" default:"${relay_keep_published}" help:"Keep published rows (state published) this long before deleting them; 0 deletes a row once the broker acknowledged it. Discarded rows are kept as long."`
	AttemptsRet     time.Duration `name:"attempts-retention" default:"${attempts_retention}" help:"Keep attempt rows untouched for this long."`
	DeadLetterRet   time.Duration `name:"dead-letter-retention" default:"${dead_letter_retention}" help:"Keep replayed and discarded dead letters this long."`

	set map[string]bool // the flags given on the command line (AfterApply)
}

// tableOnlyFlags mean something in table mode only: WAL mode has no outbox rows to read in
// batches, poll or keep, and no leader election to stand by for (the slot fences). Given with
// a schema in WAL mode they are refused with exit status 2 once the mode is read, before
// anything is published, never accepted and ignored. Retention flags (--no-janitor,
// --attempts-retention, --dead-letter-retention) apply in both modes.
var tableOnlyFlags = []string{"batch-size", "poll-interval", "standby-interval", "leader-timeout", "keep-published", "shutdown-timeout"}

// AfterApply records which flags the command line gave (kong calls it after parsing), so a
// flag that means nothing in the schema's mode can be refused rather than ignored.
func (c *RelayCmd) AfterApply(kctx *kong.Context) error {
	c.set = map[string]bool{}
	for _, p := range kctx.Path {
		if p.Flag != nil {
			c.set[p.Flag.Name] = true
		}
	}
	return nil
}

// refuseFlagsOf returns a usage error (exit 2) naming the first flag given that means
// nothing in mode, or nil.
func (c *RelayCmd) refuseFlagsOf(mode outbox.Mode) error {
	if mode != outbox.ModeWAL {
		return nil
	}
	for _, f := range tableOnlyFlags {
		if c.set[f] {
			return &exitError{code: exitUsage, err: fmt.Errorf("--%s means nothing in WAL mode (the schema's outbox mode): it applies to the table relay only; drop it", f)}
		}
	}
	return nil
}

// retention is the retention both modes run, from the retention flags.
func (c *RelayCmd) retention() retention.Config {
	return retention.Config{Disabled: c.NoJanitor, AttemptsRetention: c.AttemptsRet, DeadLetterRetention: c.DeadLetterRet}
}

// Validate refuses out-of-range values (exit 2, one line naming the flag and the range)
// instead of letting the relay replace them with its defaults.
func (c *RelayCmd) Validate() error {
	return flagcheck.First(
		flagcheck.Duration("exit-when-idle", c.ExitWhenIdle, 0, 24*time.Hour),
		flagcheck.Int("batch-size", c.BatchSize, 1, 100_000),
		flagcheck.Duration("poll-interval", c.PollInterval, 10*time.Millisecond, time.Hour),
		flagcheck.Duration("standby-interval", c.StandbyInterval, 10*time.Millisecond, time.Hour),
		flagcheck.Duration("leader-timeout", c.LeaderTimeout, time.Second, 24*time.Hour),
		flagcheck.Duration("shutdown-timeout", c.ShutdownTimeout, 0, time.Hour),
		flagcheck.Duration("keep-published", c.KeepPublished, 0, 365*24*time.Hour),
		flagcheck.Duration("attempts-retention", c.AttemptsRet, time.Minute, 365*24*time.Hour),
		flagcheck.Duration("dead-letter-retention", c.DeadLetterRet, time.Minute, 10*365*24*time.Hour),
	)
}

// Help is shown under the command's usage.
func (RelayCmd) Help() string {
	return `Publishes the rows of <schema>.outbox to Kafka: idempotent producer (acks=all), murmur2 partitioning,
woken by NOTIFY with polling as a fallback. Run several for availability: one leads (advisory lock),
the others stand by and take over within --standby-interval. SIGTERM: stop reading, wait for in-flight
deliveries, mark them, exit 0. On exit it prints {"published":N,"parked":N,"retried":N}.

In WAL mode (stored with the schema: kafkatx migrate up --outbox-mode wal) it streams the schema's
replication slot instead and publishes in Kafka transactions with a checkpoint, exactly once for
read_committed readers; a second relay waits for the slot. It needs a session connection with
replication=database (--session-database-url behind a transaction pooler). On exit it prints
{"published":N,"parked":N,"transactions":N}. See docs/outbox-wal.md.`
}

func (c *RelayCmd) Run(ctx context.Context, g *Globals) error {
	log := g.logger()
	defer log.Sync() //nolint:errcheck
	kcfg, err := g.kafkaConfig("kafkatx-relay")
	if err != nil {
		return err
	}
	// Settings both relays refuse (acks=1, enable.idempotence=false, transactional.id) are the
	// usage error, before anything connects: relays.New refused them only after the database.
	if err := relays.CheckKafka(kcfg); err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	kcfg = kafkalog.Route(log, kcfg) // librdkafka's lines through the JSON logger, not raw on stderr
	// --health-addr answers from here: /healthz 200 while the database is waited for (a
	// promotion takes up to pgstart.Within), /readyz 503 naming the wait.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	health, err := c.serveHealth(reg, log)
	if err != nil {
		return err
	}
	defer health.close()
	health.stage("waiting for the database")
	pool, err := g.servicePool(ctx, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	sp, closeSP, err := g.sessionPool(ctx, pool)
	if err != nil {
		return err
	}
	defer closeSP()
	// Leadership is a session-level lock and LISTEN: refuse a transaction pooler at start
	// (exit 1 with the reason) rather than retry it forever.
	if err := requireSession(ctx, sp); err != nil {
		return err
	}
	health.stage("applying the migrations")
	if c.Migrate {
		if _, err := migrations.Apply(ctx, sp, g.Schema); err != nil {
			return err
		}
	}
	if err := checkOutboxTable(ctx, pool, g.Schema); err != nil {
		return err
	}
	mode, err := c.mode(ctx, sp, g.Schema)
	if err != nil {
		return err
	}
	if err := c.refuseFlagsOf(mode); err != nil {
		return err
	}
	rl, err := relays.New(pool, relays.Options{Mode: mode, Kafka: kcfg, Schema: g.Schema, Logger: log, Registerer: reg,
		Session: sp.Config().ConnConfig, Retention: c.retention(),
		Table: relay.Config{BatchSize: c.BatchSize, PollInterval: c.PollInterval, StandbyInterval: c.StandbyInterval, LeaderTimeout: c.LeaderTimeout,
			ShutdownTimeout: c.ShutdownTimeout, KeepPublished: c.KeepPublished}})
	if err != nil {
		return err
	}
	return c.runRelay(ctx, rl, health, c.readyz(rl), log, func() {
		if w, ok := rl.(*walrelay.Relay); ok {
			s := w.Stats()
			log.Debug("where the stream's time went", zap.Duration("receive", s.Steps.Receive), zap.Duration("handle", s.Steps.Handle),
				zap.Duration("queue_full", s.Steps.QueueFull), zap.Duration("commit", s.Steps.Commit))
		}
		out, _ := json.Marshal(rl.Totals())
		fmt.Println(string(out))
	})
}

// runRelay runs rl until ctx ends, it fails, or (--exit-when-idle) its backlog stays empty;
// health (--health-addr) answers /readyz with readyz meanwhile. summary prints the one-line
// JSON totals on stdout after rl has stopped.
func (c *RelayCmd) runRelay(ctx context.Context, rl relays.Relay, health *healthServer, readyz http.HandlerFunc, log *zap.Logger, summary func()) error {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var runErr error
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		runErr = rl.Run(runCtx)
	}()
	health.running(readyz, done)
	if c.ExitWhenIdle > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if waitIdle(runCtx, rl, c.ExitWhenIdle, log) {
				log.Info("outbox idle; exiting", zap.Duration("exit_when_idle", c.ExitWhenIdle))
				stop()
			}
		}()
	}
	<-done
	stop()
	wg.Wait()
	summary()
	return runErr
}

// requireSession is pg.RequireSession on a connection of sp.
func requireSession(ctx context.Context, sp *pgxpool.Pool) error {
	conn, err := sp.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer conn.Release()
	if err := pg.RequireSession(ctx, conn.Conn()); err != nil {
		return fmt.Errorf("relay leadership: %w", err)
	}
	return nil
}

// checkOutboxTable fails with a helpful message when the outbox table is missing.
func checkOutboxTable(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tables.For(schema).Outbox).Scan(&ok); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if !ok {
		return fmt.Errorf("schema %q has no outbox table: run `kafkatx migrate up --schema %s` first (`kafkatx relay --migrate` does it too)", schema, shellQuote(schema))
	}
	return nil
}

// waitIdle reports true once the relay's backlog has been empty for d (checked about four
// times per d, at least every second), false when ctx ends first.
func waitIdle(ctx context.Context, rl interface {
	Pending(context.Context) (bool, error)
}, d time.Duration, log *zap.Logger) bool {
	step := min(max(d/4, 50*time.Millisecond), time.Second)
	var idleSince time.Time
	t := time.NewTicker(step)
	defer t.Stop()
	for {
		pending, err := rl.Pending(ctx)
		switch {
		case err != nil:
			idleSince = time.Time{}
			if ctx.Err() == nil {
				log.Debug("backlog check", zap.Error(err))
			}
		case pending:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) >= d:
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
