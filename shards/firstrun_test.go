package shards

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Issue 46 (a gap the first cut left): a move of a partition that has no watermark yet finds
// nothing to copy on the shard it leaves. A consumer writing that first watermark there at the
// same moment must not be overtaken: the move waits for the partition's lock, sees the row the
// first run committed and moves it, so the state never stays behind on a shard the directory
// no longer names. Without LockPartition in the move this ends with the watermark on s1 and
// the directory on s2.
func TestMoveDoesNotOvertakeAFirstRun(t *testing.T) {
	ctx := context.Background()
	const group, topic = "g", "orders"
	f := newMoveFixture(t)
	dir := NewDirectory(f.s1, f.schema)
	if _, _, err := dir.Assign(ctx, group, topic, 0, "s1"); err != nil {
		t.Fatal(err)
	}
	// The consumer's first run on s1, holding the partition's lock, its row not yet committed.
	tx, err := f.s1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := dir.ConfirmFirstRun(ctx, tx, group, topic, 0, "s1", 1); err != nil {
		t.Fatalf("first run placed on s1 at epoch 1: %v", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{f.schema, "watermarks"}.Sanitize()+` (group_id, topic, partition, next_offset, first_offset)
		VALUES ($1, $2, 0, 5, 5)`, group, topic); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Move(ctx, f.set, f.schema, MoveOptions{Group: group, Topic: topic, Partition: 0, To: "s2", Reason: "test", DrainWithin: 5 * time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the move finished (%v) while a first run on s1 held the partition's lock", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("move: %v", err)
	}
	if got := f.where(t); got != "s1 orders=0 marks=0 cancels=0; s2 orders=0 marks=1 cancels=0; " {
		t.Fatalf("after the move: %s; want the first run's watermark moved to s2", got)
	}
}

// A first run placed before a move changed the directory is refused (*MovedError): the
// consumer places the partition again.
func TestConfirmFirstRunRefusesAPlacementTheDirectoryChanged(t *testing.T) {
	ctx := context.Background()
	f := newMoveFixture(t)
	dir := NewDirectory(f.s1, f.schema)
	if _, _, err := dir.Assign(ctx, "g", "orders", 0, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := Move(ctx, f.set, f.schema, MoveOptions{Group: "g", Topic: "orders", Partition: 0, To: "s2", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shard string
		epoch int64
		ok    bool
	}{{"s1", 1, false}, {"s2", 1, false}, {"s2", 2, true}} {
		err := pgx.BeginFunc(ctx, f.s2, func(tx pgx.Tx) error { return dir.ConfirmFirstRun(ctx, tx, "g", "orders", 0, c.shard, c.epoch) })
		var moved *MovedError
		if c.ok && err != nil || !c.ok && !errors.As(err, &moved) {
			t.Errorf("placed on %s at epoch %d: %v (want ok %v)", c.shard, c.epoch, err, c.ok)
		}
	}
}
