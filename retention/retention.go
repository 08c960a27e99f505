// Package retention deletes kafkatx's rows that have served their purpose, in either outbox
// mode: attempt rows untouched for AttemptsRetention, dead letters resolved (replayed or
// discarded) more than DeadLetterRetention ago, expired idempotency keys and stored responses
// (idempotency_keys.expires_at, idempotency_responses.expires_at), Airflow ledger rows (and
// pending asset-event marks) older than AirflowLedgerRetention and, in table mode,
// published and discarded outbox rows older than the table relay's KeepPublished.
//
// It is configured once (Config) and run by whichever relay serves the schema: the table
// relay's leader (package outbox/relay) and the WAL relay while it holds the slot (package
// outbox/walrelay), in the sidecar (kafkatx relay) and in-process alike, so one process per
// database does the deleting. Every DELETE removes at most BatchSize rows (one short
// transaction), with a 10 ms pause between batches, so a large backlog never holds locks or
// bloats the WAL in one go.
package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Defaults of Config's fields.
const (
	DefaultInterval            = time.Minute
	DefaultBatchSize           = 1000
	DefaultAttemptsRetention   = 7 * 24 * time.Hour
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
	// DefaultAirflowLedgerRetention is Config.AirflowLedgerRetention's default.
	DefaultAirflowLedgerRetention = 30 * 24 * time.Hour
)

// Config configures retention. The zero value means every default.
type Config struct {
	// Disabled turns retention off: nothing is deleted.
	Disabled bool
	// Interval between passes. Defaults to 1m.
	Interval time.Duration
	// BatchSize is the most rows one DELETE removes. Defaults to 1000.
	BatchSize int
	// AttemptsRetention keeps kafkatx.attempts rows this long after their last update. A
	// message retried again after its row was deleted starts counting attempts from zero,
	// so keep it longer than any partition stays paused. Defaults to 7 days; negative keeps
	// them forever.
	AttemptsRetention time.Duration
	// DeadLetterRetention keeps replayed and discarded dead letters this long after they were
	// resolved; new dead letters are never deleted. Defaults to 30 days; negative keeps them
	// forever.
	DeadLetterRetention time.Duration
	// AirflowLedgerRetention keeps rows of the Airflow ledger (airflow_ledger: the DAG runs
	// and asset events a consumer handed to Airflow, idempotency/airflow.RecordTx) this long
	// after they were written, and pending asset-event marks (airflow_pending) as long: `kafkatx
	// airflow status` and `repair` see only what is kept. Defaults to 30 days; negative keeps
	// them forever.
	AirflowLedgerRetention time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.AttemptsRetention == 0 {
		c.AttemptsRetention = DefaultAttemptsRetention
	}
	if c.DeadLetterRetention == 0 {
		c.DeadLetterRetention = DefaultDeadLetterRetention
	}
	if c.AirflowLedgerRetention == 0 {
		c.AirflowLedgerRetention = DefaultAirflowLedgerRetention
	}
	return c
}

// job is one table's DELETE: $1 is the retention in seconds, $2 the batch size.
type job struct {
	table string
	keep  time.Duration // negative: skip
	sql   string
}

// Cleaner runs retention passes for one schema. Create it with New.
type Cleaner struct {
	pool    *pgxpool.Pool
	t       tables.Names
	cfg     Config
	log     *zap.Logger
	jobs    []job
	deleted func(table string, rows int64)
}

// Option adds to what a Cleaner deletes or reports.
type Option func(*Cleaner)

// WithOutbox also deletes the outbox table's published rows and its discarded rows resolved
// more than keep ago (table mode: Config.KeepPublished of package outbox/relay; 0 deletes
// them at the next pass, negative never).
func WithOutbox(keep time.Duration) Option {
	return func(c *Cleaner) {
		o := c.t.Outbox
		c.jobs = append([]job{{"outbox", keep, `DELETE FROM ` + o + ` WHERE id IN (SELECT id FROM ` + o + `
			WHERE state IN ('published', 'discarded') AND resolved_at < now() - make_interval(secs => $1) ORDER BY resolved_at LIMIT $2)`}}, c.jobs...)
	}
}

// OnDeleted calls f after each DELETE that removed rows (the relays' hooks and metrics).
func OnDeleted(f func(table string, rows int64)) Option {
	return func(c *Cleaner) { c.deleted = f }
}

// New returns a Cleaner of schema's tables ("" is "kafkatx") with cfg's defaults applied. It
// opens no connection.
func New(pool *pgxpool.Pool, schema string, cfg Config, log *zap.Logger, opts ...Option) *Cleaner {
	if log == nil {
		log = zap.NewNop()
	}
	t := tables.For(pg.SchemaOr(schema))
	c := &Cleaner{pool: pool, t: t, cfg: cfg.WithDefaults(), log: log}
	c.jobs = []job{
		{"attempts", c.cfg.AttemptsRetention, `DELETE FROM ` + t.Attempts + ` WHERE ctid IN (SELECT ctid FROM ` + t.Attempts + `
			WHERE updated_at < now() - make_interval(secs => $1) LIMIT $2)`},
		{"dead_letters", c.cfg.DeadLetterRetention, `DELETE FROM ` + t.DeadLetters + ` WHERE id IN (SELECT id FROM ` + t.DeadLetters + `
			WHERE status IN ('replayed', 'discarded') AND resolved_at < now() - make_interval(secs => $1) LIMIT $2)`},
		{"airflow_ledger", c.cfg.AirflowLedgerRetention, `DELETE FROM ` + t.AirflowLedger + ` WHERE id IN (SELECT id FROM ` + t.AirflowLedger + `
			WHERE created_at < now() - make_interval(secs => $1) ORDER BY created_at LIMIT $2)`},
		{"airflow_pending", c.cfg.AirflowLedgerRetention, `DELETE FROM ` + t.AirflowPending + ` WHERE kafkatx_id IN (SELECT kafkatx_id FROM ` + t.AirflowPending + `
			WHERE sent_at < now() - make_interval(secs => $1) LIMIT $2 FOR UPDATE SKIP LOCKED)`},
	}
	// Expired idempotency keys and stored responses: expires_at is the row's own deadline,
	// so $1 (a retention) is not used; SKIP LOCKED leaves a key a transaction holds.
	for _, tb := range []struct{ name, t string }{{"idempotency_keys", t.Idempotency}, {"idempotency_responses", t.IdempotencyResponses}} {
		c.jobs = append(c.jobs, job{tb.name, 0, IdempotencySQL(tb.t)})
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// IdempotencySQL is the DELETE of table's expired rows (idempotency_keys or
// idempotency_responses, quoted): $2 rows at most, $1 unused; rows locked by a running
// transaction are skipped.
func IdempotencySQL(table string) string {
	return `DELETE FROM ` + table + ` WHERE (scope, key) IN (
SELECT scope, key FROM ` + table + ` WHERE expires_at <= now() AND $1::float8 >= 0 LIMIT $2 FOR UPDATE SKIP LOCKED)`
}

// Config returns the Cleaner's configuration, defaults applied.
func (c *Cleaner) Config() Config { return c.cfg }

// Run runs a pass at once and then every Interval until ctx is done; a failed pass is logged
// and tried again at the next. With Disabled it returns at once.
func (c *Cleaner) Run(ctx context.Context) {
	if c.cfg.Disabled {
		return
	}
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := c.Clean(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("retention pass failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Clean runs one pass now, whatever Disabled says, and returns how many rows it deleted per
// table. It stops at the first failed DELETE (the error names the table).
func (c *Cleaner) Clean(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	for _, j := range c.jobs {
		if j.keep < 0 {
			continue
		}
		total := int64(0)
		for {
			tag, err := c.pool.Exec(ctx, j.sql, j.keep.Seconds(), c.cfg.BatchSize)
			if err != nil {
				return out, fmt.Errorf("retention: delete old %s rows: %w", j.table, err)
			}
			n := tag.RowsAffected()
			total += n
			if n > 0 && c.deleted != nil {
				c.deleted(j.table, n)
			}
			if n < int64(c.cfg.BatchSize) {
				break
			}
			select { // small batches, with room for other work between them
			case <-ctx.Done():
				return out, nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		if total > 0 {
			out[j.table] = total
			c.log.Info("retention deleted old rows", zap.String("table", j.table), zap.Int64("rows", total))
		}
	}
	return out, nil
}
