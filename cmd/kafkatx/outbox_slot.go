package main

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/outbox"
)

// OutboxDropSlotCmd drops the WAL outbox's replication slot.
type OutboxDropSlotCmd struct {
	Force bool `help:"Drop it even while the schema is in WAL mode (writers then refuse to emit until kafkatx migrate up --outbox-mode wal recreates it) or while it holds outbox records no relay published (they are lost)."`
}

// Help is shown under the command's usage.
func (OutboxDropSlotCmd) Help() string {
	return `A replication slot pins WAL until its relay confirms it: drop the slot of a schema that no longer
uses WAL mode (after kafkatx migrate up --outbox-mode table and a WAL relay that published what the slot
held), or of a database being removed. Fails while a relay streams from it and, without --force, while
it holds outbox records no relay published.`
}

func (c *OutboxDropSlotCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := outbox.DropSlot(ctx, pool, g.Schema, c.Force)
	if err != nil {
		return err
	}
	fmt.Printf("dropped replication slot %s\n", slot)
	return nil
}
