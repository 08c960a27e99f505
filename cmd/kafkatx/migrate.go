package main

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/internal/migrations"
)

// MigrateCmd applies or prints the embedded migrations.
type MigrateCmd struct {
	Up    MigrateUpCmd    `cmd:"" help:"Apply pending migrations (safe to run from several processes at once)."`
	Print MigratePrintCmd `cmd:"" help:"Print every migration as one SQL script, for goose, atlas or tern users."`
}

// MigrateUpCmd applies pending migrations.
type MigrateUpCmd struct{}

func (MigrateUpCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	sp, closeSP, err := g.sessionPool(ctx, pool)
	if err != nil {
		return err
	}
	defer closeSP()
	done, err := migrations.Apply(ctx, sp, g.Schema)
	if err != nil {
		return err
	}
	fmt.Printf("schema %s at version %d (applied %v)\n", g.Schema, migrations.Latest(), done)
	return nil
}

// MigratePrintCmd prints the SQL.
type MigratePrintCmd struct{}

func (MigratePrintCmd) Run(g *Globals) error {
	fmt.Print(migrations.Script(g.Schema))
	return nil
}
