package shards

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/pg"
)

// LockPartition takes, in tx on a shard, the transaction-scoped advisory lock that a
// partition's first run on that shard and a move taking the partition's state from it both
// hold: a move that finds no watermark there (nothing to copy) cannot overtake a first run
// that is writing one, and a first run that takes the lock after a move began sees the
// directory row the move changed (ConfirmFirstRun).
func LockPartition(ctx context.Context, tx pgx.Tx, schema, group, topic string, partition int32) error {
	key := "kafkatx.shards.partition." + pg.SchemaOr(schema) + "." + strconv.Quote(group) + "." + strconv.Quote(topic) + "." + strconv.Itoa(int(partition))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
		return fmt.Errorf("lock partition %d of %s on its shard: %w", partition, topic, err)
	}
	return nil
}

// MovedError is ConfirmFirstRun's answer when the directory no longer maps the partition to
// the shard and epoch it was placed with: the first run is rolled back and the partition placed
// anew.
type MovedError struct {
	Partition int32
	Topic     string
	Shard     string // where the partition was placed
	Epoch     int64  // the epoch it was placed with
	Now       Entry  // the directory row now (zero when there is none)
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("partition %d of %s was placed on shard %s at epoch %d, but the shard directory now has it on %s (epoch %d, %s): placing it again",
		e.Partition, e.Topic, e.Shard, e.Epoch, e.Now.Shard, e.Now.Epoch, e.Now.State)
}

// ConfirmFirstRun takes the partition's lock in tx (on the shard it was placed on:
// LockPartition) and then reads the directory: the partition must still be mapped to shard at
// epoch, and active there. Otherwise *MovedError, and the caller rolls back and places the
// partition again. A partition that never ran does not start while a move of it is in
// progress (a consumer placed it on the target because the shard it leaves holds no
// watermark): a cancel could still send it back there. Such a move copies nothing and ends
// within moments; its consumer retries the assignment meanwhile.
func (d *Directory) ConfirmFirstRun(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, shard string, epoch int64) error {
	if err := LockPartition(ctx, tx, d.t.Schema, group, topic, partition); err != nil {
		return err
	}
	e, err := d.Entry(ctx, group, topic, partition)
	if err != nil {
		return err
	}
	if e != nil && e.Epoch == epoch && e.State == StateActive && e.Shard == shard {
		return nil
	}
	me := &MovedError{Partition: partition, Topic: topic, Shard: shard, Epoch: epoch}
	if e != nil {
		me.Now = *e
	}
	return me
}
