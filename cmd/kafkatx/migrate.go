package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

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
	set, closeShards, err := g.shardSet(ctx, pool)
	if err != nil {
		return err
	}
	defer closeShards()
	// The directory's database (--database-url), then each --shard whose database is another.
	// With --shard, --outbox-mode is set on the shards only: the directory's database holds no
	// outbox unless it is a shard too, and a slot there would only retain its WAL.
	type target struct {
		name   string
		pool   *pgxpool.Pool
		outbox bool // set --outbox-mode here
	}
	targets := []target{{"", sp, set == nil}}
	if set != nil {
		for _, sh := range set.Shards {
			if sh.Pool == pool {
				targets[0].outbox = true
			} else {
				targets = append(targets, target{sh.Name, sh.Pool, true})
			}
		}
	}
	for _, t := range targets {
		if err := c.migrate(ctx, t.pool, g.Schema, t.name, t.outbox); err != nil {
			if t.name != "" {
				return fmt.Errorf("shard %s: %w", t.name, err)
			}
			return err
		}
	}
	return nil
}

// migrate brings schema on pool (shard name, "" for --database-url's database) up to date and,
// with setMode, sets the outbox mode asked for.
func (c MigrateUpCmd) migrate(ctx context.Context, sp *pgxpool.Pool, schema, shard string, setMode bool) error {
	on := ""
	if shard != "" {
		on = "shard " + shard + ": "
	}
	done, err := migrations.Apply(ctx, sp, schema)
	if err != nil {
		return err
	}
	fmt.Printf("%sschema %s at version %d (applied %v)\n", on, schema, migrations.Latest(), done)
	if c.OutboxMode != "" && setMode {
		set := outbox.SetMode
		if c.Force {
			set = outbox.SetModeForce
		}
		if err := set(ctx, sp, schema, outbox.Mode(c.OutboxMode)); err != nil {
			return err
		}
		st, err := outbox.ReadSettings(ctx, sp, schema)
		if err != nil {
			return err
		}
		if st.Mode == outbox.ModeWAL {
			fmt.Printf("%soutbox mode wal (slot %s, publication %s)\n", on, st.Slot, st.Publication)
		} else {
			fmt.Printf("%soutbox mode table\n", on)
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
