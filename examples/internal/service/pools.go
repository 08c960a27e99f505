package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/pgstart"
)

// Pools are a binary's database pools: Pool for its transactions (--database-url) and Session
// for what needs a session across transactions (--session-database-url, default
// --database-url): kafkatx's and the example's migrations (a session-level advisory lock)
// and the relay's leadership lock and LISTEN (Options.Session).
type Pools struct {
	Pool, Session *pgxpool.Pool
	// Pooled: --database-url goes through a transaction pooler (pg.ParsePoolConfig), so Pool
	// runs pgx's QueryExecModeExec (no named prepared statements).
	Pooled bool
}

// DefaultMaxConns is the least size of Pool unless --database-url sets pool_max_conns: one
// connection per partition in a transaction (3 by default, 6 in the scale-out benchmark) and
// the in-process relay's read, mark and gauge queries. pgxpool's own default, max(4, CPUs),
// is 4 on a 2-core machine, and the relay's mark then waited for a partition's connection.
const DefaultMaxConns = 10

// DefaultMaxOutboxRows is examples/orders' --max-outbox-rows: the consumer's partitions wait
// before a transaction while the outbox holds more rows (outbox.Writer.WaitBelow, through
// kafkatx.Config.Backpressure), so a drain of a large backlog does not leave the relay an
// outbox as large as the backlog. Measured on 300,000 orders with events (2 cores, make
// bench): no bound 19.2–21.7 s and an outbox of 157,000–163,000 rows; 100,000 rows 15.9 s
// (109,673); 50,000 16.2–16.8 s (62,000–70,000 rows); 20,000 27–44 s, because the row
// estimate is about a second late and the partitions then wait while the relay has already
// caught up: keep the bound at several seconds of the relay's rate (docs/relay.md).
const DefaultMaxOutboxRows = 100_000

// OpenPools opens f's pools. Through a transaction pooler Pool uses QueryExecModeExec (unless
// the URL sets default_query_exec_mode); Session is a second, small pool (4 connections) only
// when --session-database-url differs from --database-url. Errors are pgx's, never a
// password. Close closes both.
func (f *Flags) OpenPools(ctx context.Context, log *zap.Logger) (*Pools, error) {
	first, err := pg.ParseConfig(f.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	// A server starting up, in recovery or being promoted (57P03), or not listening yet, is
	// waited for (pgstart.Within); a refused login or a missing database is named at once.
	if err := pgstart.Await(ctx, first.ConnConfig, pgstart.Within, log); err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	cfg, pooled, err := pg.ParsePoolConfig(ctx, f.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if pooled {
		log.Info("--database-url goes through a transaction pooler: pgx runs without prepared statements (QueryExecModeExec); migrations and the relay's leadership use --session-database-url")
	}
	if !strings.Contains(f.DatabaseURL, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, DefaultMaxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	p := &Pools{Pool: pool, Session: pool, Pooled: pooled}
	if f.SessionDatabaseURL != "" && f.SessionDatabaseURL != f.DatabaseURL {
		scfg, err := pg.ParseConfig(f.SessionDatabaseURL)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("--session-database-url: %w", err)
		}
		scfg.MaxConns = 4
		if p.Session, err = pgxpool.NewWithConfig(ctx, scfg); err != nil {
			pool.Close()
			return nil, fmt.Errorf("--session-database-url: %w", err)
		}
	}
	return p, nil
}

// Close closes the pools.
func (p *Pools) Close() {
	if p.Session != p.Pool {
		p.Session.Close()
	}
	p.Pool.Close()
}

// SessionRefusal returns err, or, when err wraps pg.ErrTransactionPooled (a session-level
// lock or LISTEN through a transaction pooler), an error that names the remedy every example
// binary has in place of the library's (which names kafkatx.Config fields and commands):
// its --session-database-url flag.
func SessionRefusal(err error) error {
	if !errors.Is(err, pg.ErrTransactionPooled) {
		return err
	}
	return fmt.Errorf("%w: pass --session-database-url with a URL that reaches PostgreSQL directly or through a session pooler, "+
		"for the migrations' lock (and a relay's leadership); --database-url may stay on the transaction pooler", pg.ErrTransactionPooled)
}
