package main

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/outbox"
)

// MigrateCmd applies or prints the embedded migrations.
type MigrateCmd struct {
	Up    MigrateUpCmd    `cmd:"" help:"Apply pending migrations (safe to run from several processes at once)."`
	Print MigratePrintCmd `cmd:"" help:"Print every migration as one SQL script, for goose, atlas or tern users."`
}

// MigrateUpCmd applies pending migrations and, with --outbox-mode, sets the outbox's mode.
type MigrateUpCmd struct {
	OutboxMode string `name:"outbox-mode" enum:"${outbox_modes}," default:"" help:"Set the outbox's mode, stored with the schema: wal (transactional logical-decoding messages relayed from a replication slot, created here with its publication) or table (rows). Switching to wal refuses while the table holds pending rows; switching to table refuses while the slot, streamed by no relay, holds unpublished outbox records (drain it with the WAL relay first, or --force), and keeps the slot (kafkatx outbox drop-slot drops it). Empty: unchanged (table for a new schema)."`
	Force      bool   `help:"With --outbox-mode table: switch even while the replication slot holds outbox records no relay published (they are lost)."`
}

func (c MigrateUpCmd) Run(ctx context.Context, g *Globals) error {
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
	if c.OutboxMode != "" {
		set := outbox.SetMode
		if c.Force {
			set = outbox.SetModeForce
		}
		if err := set(ctx, sp, g.Schema, outbox.Mode(c.OutboxMode)); err != nil {
			return err
		}
		st, err := outbox.ReadSettings(ctx, sp, g.Schema)
		if err != nil {
			return err
		}
		if st.Mode == outbox.ModeWAL {
			fmt.Printf("outbox mode wal (slot %s, publication %s)\n", st.Slot, st.Publication)
		} else {
			fmt.Printf("outbox mode table\n")
		}
	}
	return nil
}

// MigratePrintCmd prints the SQL.
type MigratePrintCmd struct{}

func (MigratePrintCmd) Run(g *Globals) error {
	fmt.Print(migrations.Script(g.Schema))
	return nil
}
