package kafkatx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pg"
)

// Issue 48, defect 7: the library's refusal behind PgBouncer names what a library caller can
// do — Config.SkipMigrations and `kafkatx migrate up` — not a binary's flag.
func TestMigrateRefusalBehindPgBouncerNamesTheLibraryRemedy(t *testing.T) {
	t.Parallel()
	pooled := testenv.ThroughPgBouncer(t, testenv.Database(t))
	cfg, err := pg.ParseConfig(pooled)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = testenv.QueryExecModes["exec"]
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = Migrate(context.Background(), pool, "kafkatx")
	if !errors.Is(err, pg.ErrTransactionPooled) {
		t.Fatalf("Migrate through PgBouncer: %v, want pg.ErrTransactionPooled", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "Config.SkipMigrations") || !strings.Contains(msg, "kafkatx migrate up") || strings.Contains(msg, "--session-database-url") {
		t.Fatalf("the refusal does not name the library's remedy: %v", err)
	}
}
