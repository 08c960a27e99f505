package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/pg"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/retention"
)

// JanitorConfig configures a Janitor. A nil *JanitorConfig means all defaults.
type JanitorConfig struct {
	// Schema holds kafkatx's tables. Defaults to "kafkatx".
	Schema string
	// Interval is the pause between sweeps once a sweep found nothing more to delete.
	// Defaults to 1 minute.
	Interval time.Duration
	// BatchSize is the most rows deleted per statement (one short transaction each), so a
	// large backlog never holds locks or bloats WAL in one go. Defaults to 1000.
	BatchSize int
	// Logger receives the janitor's logs, named "kafkatx.idempotency.janitor". Defaults to
	// zap.NewNop().
	Logger *zap.Logger
}

// Janitor deletes expired rows of the idempotency_keys and idempotency_responses tables in
// small batches. It runs the same DELETE as package retention, which both relays already run
// in either outbox mode: a Janitor is for a service that runs no relay. Create one with
// NewJanitor and run it with Run; it starts no goroutine.
type Janitor struct {
	pool   *pgxpool.Pool
	cfg    JanitorConfig
	tables []string
}

// NewJanitor returns a Janitor for pool. It opens no connection.
func NewJanitor(pool *pgxpool.Pool, cfg *JanitorConfig) *Janitor {
	c := JanitorConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = pg.SchemaOr(c.Schema)
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	c.Logger = c.Logger.Named("kafkatx.idempotency.janitor")
	return &Janitor{pool: pool, cfg: c, tables: []string{
		keysTable(c.Schema),
		tables.For(c.Schema).IdempotencyResponses,
	}}
}

// Run sweeps every Interval until ctx is done, then returns nil. A failed sweep is logged
// and tried again at the next interval.
func (j *Janitor) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := j.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			j.cfg.Logger.Warn("sweep expired idempotency keys", zap.Error(err))
		case n > 0:
			j.cfg.Logger.Info("deleted expired idempotency keys", zap.Int64("rows", n))
		}
		t.Reset(j.cfg.Interval)
	}
}

// Sweep deletes expired rows, BatchSize per statement, until none is left, and returns how
// many rows it deleted. Rows locked by a running transaction are skipped (SKIP LOCKED).
func (j *Janitor) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for _, t := range j.tables {
		q := retention.IdempotencySQL(t) // one DELETE of expired keys, shared with the relays' retention
		for {
			tag, err := j.pool.Exec(ctx, q, 0, j.cfg.BatchSize)
			if err != nil {
				return total, fmt.Errorf("delete expired rows of %s: %w", t, err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(j.cfg.BatchSize) {
				break
			}
			if err := ctx.Err(); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}
