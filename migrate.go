package kafkatx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/pgstart"
)

// Migrate applies kafkatx's embedded migrations to schema ("" means "kafkatx") under an
// advisory lock; it is safe to run from several processes at once and to run again. The lock
// is session-level: through a transaction pooler it fails with an error wrapping
// pg.ErrTransactionPooled that names the remedy (MigrateRemedy).
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema = pg.SchemaOr(schema)
	_, err := migrations.Apply(ctx, pool, schema)
	if errors.Is(err, pg.ErrTransactionPooled) {
		return fmt.Errorf("%w; %s", err, MigrateRemedy)
	}
	return err
}

// MigrateRemedy is what Migrate's refusal through a transaction pooler tells a library
// caller to do.
const MigrateRemedy = "apply the migrations over a URL that reaches PostgreSQL directly or through a session pooler " +
	"(`kafkatx migrate up --database-url URL`, or Migrate on a pool of that URL) and run the consumer with Config.SkipMigrations"

// MigrationSQL returns the SQL that Migrate applies, for teams that run their own
// migration tool (goose, atlas, tern).
func MigrationSQL(schema string) string {
	schema = pg.SchemaOr(schema)
	return migrations.Script(schema)
}

// prepareSchema applies the migrations to schema, or with skip checks them
// (Config.SkipMigrations). A database that is not ready (pgstart.NotYet: restarting, out of
// connection slots, not accepting connections, sessions ended under it) is waited for, for
// pgstart.Within, logged on log (pgstart.Retry); any other error is returned at once.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, schema string, skip bool, log *zap.Logger) error {
	var missing []int
	err := pgstart.Retry(ctx, pgstart.Within, log, func(ctx context.Context) error {
		if !skip {
			return Migrate(ctx, pool, schema)
		}
		var err error
		missing, err = migrations.Missing(ctx, pool, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("kafkatx: %w", err)
	}
	if len(missing) > 0 {
		return &MigrationsMissingError{Schema: schema, Missing: missing}
	}
	return nil
}
