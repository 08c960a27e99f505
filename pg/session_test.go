package pg_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pg"
)

// A direct connection keeps its session; one through PgBouncer in transaction mode does not,
// and RequireSession, ParsePoolConfig and the migrations' session lock all see it.
func TestTransactionPoolerIsDetectedAndSessionLocksRefused(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	pooled := testenv.ThroughPgBouncer(t, direct)
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		url    string
		pooled bool
	}{{"direct", direct, false}, {"pgbouncer transaction mode", pooled, true}} {
		t.Run(tc.name, func(t *testing.T) {
			conn := simpleConn(t, tc.url)
			var err error
			// Several times: the answer must not depend on which backend the pooler hands out.
			for i := 0; i < 5; i++ {
				err = pg.RequireSession(ctx, conn)
				if got := errors.Is(err, pg.ErrTransactionPooled); got != tc.pooled || (!tc.pooled && err != nil) {
					t.Fatalf("RequireSession #%d: %v, want pooled=%v", i, err, tc.pooled)
				}
			}

			pcfg, got, err := pg.ParsePoolConfig(ctx, tc.url)
			if err != nil || got != tc.pooled {
				t.Fatalf("ParsePoolConfig: pooled=%v err=%v, want pooled=%v", got, err, tc.pooled)
			}
			wantMode := pgx.QueryExecModeCacheStatement
			if tc.pooled {
				wantMode = pgx.QueryExecModeExec
			}
			if pcfg.ConnConfig.DefaultQueryExecMode != wantMode {
				t.Fatalf("exec mode %v, want %v", pcfg.ConnConfig.DefaultQueryExecMode, wantMode)
			}
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			// The same parameterized statement many times: with named prepared statements
			// through PgBouncer 1.18 this fails ("prepared statement ... does not exist").
			for i := 0; i < 50; i++ {
				var n int
				if err := pool.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&n); err != nil || n != i+1 {
					t.Fatalf("query %d: %d, %v", i, n, err)
				}
			}
			_, err = migrations.Apply(ctx, pool, "kafkatx")
			if tc.pooled != errors.Is(err, pg.ErrTransactionPooled) || (!tc.pooled && err != nil) {
				t.Fatalf("migrations.Apply: %v, want refused=%v", err, tc.pooled)
			}
		})
	}
}

// Regression: with other clients busy on the same PgBouncer, one of them often takes the
// server connection the probe just released, and a single round then proved nothing; the
// probe read that as "session" and a relay behind PgBouncer ran with pgx's statement cache
// ("prepared statement ... already exists", found in CI). Every answer must still be
// "transaction pooler".
func TestTransactionPoolerIsDetectedWhileOthersUseIt(t *testing.T) {
	t.Parallel()
	direct := testenv.Database(t)
	pooled := testenv.ThroughPgBouncer(t, direct)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	busyCfg, err := pgxpool.ParseConfig(pooled)
	if err != nil {
		t.Fatal(err)
	}
	busyCfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	busyCfg.MaxConns = 12
	busy, err := pgxpool.NewWithConfig(ctx, busyCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, _ = busy.Exec(ctx, "SELECT 1")
			}
		}()
	}
	defer wg.Wait()
	defer cancel()

	conn := simpleConn(t, pooled)
	for i := 0; i < 200; i++ {
		if err := pg.RequireSession(ctx, conn); !errors.Is(err, pg.ErrTransactionPooled) {
			t.Fatalf("RequireSession #%d with other clients on the pooler: %v, want ErrTransactionPooled", i, err)
		}
	}
}

// simpleConn connects to url with the simple protocol (as the probe does), closed at cleanup.
func simpleConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
