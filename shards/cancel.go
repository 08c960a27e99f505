package shards

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// CancelHook deletes the user's rows of one partition that a MoveHook wrote on the target
// shard, in to (the transaction on the target that deletes kafkatx's copied state there). It
// must be idempotent (a cancel resumed after a crash runs it again, maybe over nothing). An
// error aborts the cancel; the move stays "moving", resumable or cancellable.
type CancelHook func(ctx context.Context, to pgx.Tx, group, topic string, partition int32) error

// CancelOptions says which move CancelMove cancels.
type CancelOptions struct {
	Group, Topic string
	Partition    int32
	Reason       string     // required: written to the shard_move_cancel audit rows
	Actor        string     // the audit rows' actor; default "kafkatx shards move --cancel"
	Undo         CancelHook // deletes what the move's MoveHook wrote on the target; nil: nothing
}

// NotMovingError is CancelMove's refusal when the partition has no move in progress.
type NotMovingError struct {
	Group, Topic string
	Partition    int32
	Entry        *Entry // the partition's row; nil when it has none
}

func (e *NotMovingError) Error() string {
	if e.Entry == nil {
		return fmt.Sprintf("partition %d of topic %q (group %q) has no row in the shard directory: no move to cancel", e.Partition, e.Topic, e.Group)
	}
	return fmt.Sprintf("partition %d of topic %q (group %q) is active on shard %q (epoch %d): no move in progress to cancel",
		e.Partition, e.Topic, e.Group, e.Entry.Shard, e.Entry.Epoch)
}

// CutOverError is CancelMove's refusal once the move passed its cut-over (Move's step 3
// committed): the partition's state is gone from the shard it left and lives on the target,
// where consumers may already apply its messages. Finish the move instead.
type CutOverError struct {
	Entry Entry
	// StaleSource, when not nil, says the shard the move leaves still holds a watermark, but
	// behind the target's: a stale copy (that shard restored from an older backup).
	StaleSource *StaleSourceError
}

func (e *CutOverError) Error() string {
	if e.StaleSource != nil {
		return "the move passed its cut-over; it cannot be cancelled: " + e.StaleSource.Error()
	}
	return fmt.Sprintf("the move of partition %d of topic %q (group %q) from shard %q to shard %q (epoch %d) passed its cut-over: the partition's state was deleted on %s and lives on %s, "+
		"where consumers may already apply it; it cannot be cancelled: finish it with `kafkatx shards move --group %s --topic %s --partition %d --to %s --reason ...`",
		e.Entry.Partition, e.Entry.Topic, e.Entry.Group, e.Entry.Shard, e.Entry.MovingTo, e.Entry.Epoch, e.Entry.Shard, e.Entry.MovingTo,
		e.Entry.Group, e.Entry.Topic, e.Entry.Partition, e.Entry.MovingTo)
}

// CancelMove cancels a move of partition o.Partition of o.Topic (group o.Group) that has not
// passed its cut-over, and returns the partition's directory row afterwards: active on the
// shard it never left, with its epoch raised once more (what the move's epoch fenced stays
// fenced). Holding the lock on the old shard's watermark row that Move's copy takes (so a
// mover still running waits, then finds the move cancelled and stops):
//
//  1. on the target, the partition's state a copy wrote there is deleted, o.Undo deletes the
//     hook's rows, and a shard_move_cancel audit row is written; the target commits;
//  2. the directory row is set active on the old shard, epoch raised;
//  3. a shard_move_cancel audit row is written on the old shard, which commits.
//
// A crash before 2 leaves the move "moving" (cancel or resume it again); after 2 it is
// cancelled. Errors: *NotMovingError (no move in progress), *CutOverError (the old shard no
// longer holds the partition's state and the target does: finish the move), or a database
// error (nothing changed past the last step done).
func CancelMove(ctx context.Context, set *Set, schema string, o CancelOptions) (Entry, error) {
	var e Entry
	if err := set.Validate(); err != nil {
		return e, err
	}
	if o.Reason == "" {
		return e, errors.New("shards: a cancel needs a reason (it is audited)")
	}
	if o.Actor == "" {
		o.Actor = "kafkatx shards move --cancel"
	}
	schema = pg.SchemaOr(schema)
	t := tables.For(schema)
	es, err := NewDirectory(set.Directory, schema).Entry(ctx, o.Group, o.Topic, o.Partition)
	if err != nil {
		return e, err
	}
	if es == nil || es.State != StateMoving {
		return e, &NotMovingError{Group: o.Group, Topic: o.Topic, Partition: o.Partition, Entry: es}
	}
	e = *es
	source, target := set.Pool(e.Shard), set.Pool(e.MovingTo)
	if source == nil || target == nil {
		return e, fmt.Errorf("shards: the move of partition %d of %s goes from shard %q to shard %q: pass both (--shard); given %v", o.Partition, o.Topic, e.Shard, e.MovingTo, set.Names())
	}
	fail := func(err error) (Entry, error) {
		return e, fmt.Errorf("shards: cancel the move of partition %d of %s from %s to %s (the row stays moving: cancel or resume it again): %w",
			o.Partition, o.Topic, e.Shard, e.MovingTo, err)
	}
	store := offsetstore.New(schema)
	ftx, err := source.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer ftx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	// As Move: a first run on the source is seen.
	if err := LockPartition(ctx, ftx, schema, o.Group, o.Topic, o.Partition); err != nil {
		return fail(err)
	}
	w := int64(-1)
	err = ftx.QueryRow(ctx, `SELECT next_offset FROM `+t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
		o.Group, o.Topic, o.Partition).Scan(&w)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fail(fmt.Errorf("lock the watermark on %s: %w", e.Shard, err))
	}
	ttx, err := target.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer ttx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	// A first run on the target (placed there while the source held no watermark) is seen, or
	// waits for this cancel and then finds the directory changed (ConfirmFirstRun).
	if err := LockPartition(ctx, ttx, schema, o.Group, o.Topic, o.Partition); err != nil {
		return fail(err)
	}
	if w >= 0 {
		if err := checkNotStale(ctx, target, t, e, w); err != nil {
			var st *StaleSourceError
			if errors.As(err, &st) {
				return e, &CutOverError{Entry: e, StaleSource: st}
			}
			return fail(err)
		}
	}
	if w < 0 {
		var there bool
		if err := ttx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3)`,
			o.Group, o.Topic, o.Partition).Scan(&there); err != nil {
			return fail(err)
		}
		if there {
			return e, &CutOverError{Entry: e}
		}
	}
	// Under the lock, the row is still this move's (a mover's cut-over takes the lock first).
	var cur []Entry
	rows, err := set.Directory.Query(ctx, `SELECT `+entryCols+` FROM `+t.ShardDirectory+` WHERE group_id = $1 AND topic = $2 AND partition = $3`,
		o.Group, o.Topic, o.Partition)
	if err == nil {
		cur, err = scanEntries(rows)
	}
	if err != nil {
		return fail(err)
	}
	if len(cur) != 1 || cur[0].State != StateMoving || cur[0].Epoch != e.Epoch || cur[0].MovingTo != e.MovingTo {
		return fail(errors.New("the directory row changed meanwhile (another mover or cancel): look at kafkatx shards status and try again"))
	}
	reason := fmt.Sprintf("move of partition from shard %s to shard %s cancelled before its cut-over (directory epoch %d, now %d; the partition stays on %s): %s",
		e.Shard, e.MovingTo, e.Epoch, e.Epoch+1, e.Shard, o.Reason)
	ev := offsetstore.Event{Group: o.Group, Topic: o.Topic, Partition: o.Partition, Kind: offsetstore.KindShardMoveCancel, From: w, To: w, Actor: o.Actor, Reason: reason}
	// 1. The target's copy.
	id, err := store.InsertEvent(ctx, ttx, ev)
	if err != nil {
		return fail(err)
	}
	if _, err := ttx.Exec(ctx, `SELECT set_config('kafkatx.audit_id', $1, true)`, strconv.FormatInt(id, 10)); err != nil {
		return fail(err)
	}
	for _, tb := range t.PartitionState() {
		if _, err := ttx.Exec(ctx, `DELETE FROM `+tb.Quoted+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, o.Group, o.Topic, o.Partition); err != nil {
			return fail(fmt.Errorf("delete the copy in %s on %s: %w", tb.Quoted, e.MovingTo, err))
		}
	}
	if o.Undo != nil {
		if err := o.Undo(ctx, ttx, o.Group, o.Topic, o.Partition); err != nil {
			return fail(fmt.Errorf("the cancel hook: %w", err))
		}
	}
	if err := ttx.Commit(ctx); err != nil {
		return fail(fmt.Errorf("commit on %s: %w", e.MovingTo, err))
	}
	if err := testAfter("cancel-target"); err != nil {
		return e, err
	}
	// 2. The directory.
	err = set.Directory.QueryRow(ctx, `UPDATE `+t.ShardDirectory+` SET state = 'active', moving_to = NULL, epoch = epoch + 1, updated_at = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND state = 'moving' AND epoch = $4
		RETURNING `+entryCols, o.Group, o.Topic, o.Partition, e.Epoch).Scan(&e.Group, &e.Topic, &e.Partition, &e.Shard, &e.Epoch, &e.State, &e.MovingTo, &e.UpdatedAt)
	if err != nil {
		return fail(fmt.Errorf("set the directory row active: %w", err))
	}
	if err := testAfter("cancel-directory"); err != nil {
		return e, err
	}
	// 3. The old shard's audit row.
	if _, err := store.InsertEvent(ctx, ftx, ev); err != nil {
		return e, fmt.Errorf("shards: the move was cancelled, but its audit row on %s was not written: %w", e.Shard, err)
	}
	if err := ftx.Commit(ctx); err != nil {
		return e, fmt.Errorf("shards: the move was cancelled, but its audit row on %s was not written: %w", e.Shard, err)
	}
	return e, nil
}

// Entry returns the directory row of one partition of group's topic, or nil when the
// directory has none (the partition not placed yet). Errors are the database's.
func (d *Directory) Entry(ctx context.Context, group, topic string, partition int32) (*Entry, error) {
	rows, err := d.q.Query(ctx, `SELECT `+entryCols+` FROM `+d.t.ShardDirectory+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("read the shard directory: %w", err)
	}
	es, err := scanEntries(rows)
	if err != nil || len(es) == 0 {
		return nil, err
	}
	return &es[0], nil
}
