package shards

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// MoveHook moves the user's own rows of one partition between shards: it reads them in from
// (the transaction on the shard the partition leaves), writes them in to (the transaction on
// the target shard) and deletes them in from. It runs after kafkatx's own state was copied in
// to and before either transaction commits; to commits first, then from. It must be
// idempotent on to: a move resumed after a crash between the two commits runs it again over
// rows a previous run already wrote there (delete the partition's rows in to first, or
// upsert). An error aborts the move's step; the old shard stays authoritative.
//
// A move cancelled after to committed (CancelMove) leaves the rows the hook wrote on the
// target there: CancelOptions.Undo deletes them (the hook's inverse on to alone); without it
// they stay as a stale copy that a later move's hook replaces (it deletes first on to).
type MoveHook func(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error

// MoveOptions says what Move moves where.
type MoveOptions struct {
	Group, Topic string
	Partition    int32
	To           string // the target shard's name
	Reason       string // required: written to both shards' shard_move audit rows
	Actor        string // the audit rows' actor; default "kafkatx shards move"
	Hook         MoveHook
	// DrainWithin bounds the wait at the cut-over for the old shard's relay to publish the
	// outbox rows committed there before it (Move's step 2); default DefaultDrainWithin.
	// Past it Move fails with *DrainError and the move stays resumable.
	DrainWithin time.Duration
}

// DefaultDrainWithin is MoveOptions.DrainWithin's default.
const DefaultDrainWithin = 60 * time.Second

// The partition's state that moves: tables.Names.PartitionState (watermark, attempts, done
// offsets, parked keys, dead letters). Outbox rows are not moved: the shard they were written
// on publishes them (its relay), under their ids derived from the input message, and the
// cut-over waits until it has (Move's step 2), so a key's events keep their order on the topic
// across the move. Idempotency
// keys are keyed by business key, not partition, and stay where they were claimed; the offset
// audit's history stays on the shard that wrote it (offsets audit reads every shard); Airflow
// ledger rows stay too (airflow status and repair read every shard).

// Move moves partition o.Partition of o.Topic, read by o.Group, to shard o.To while consumers
// run, and returns its directory row afterwards (state active on o.To, a higher epoch):
//
//  1. the directory row is set moving to o.To with its epoch raised (a partition without a
//     row is assigned to o.To at once: it has no state yet);
//  2. on the old shard, the partition's watermark row is locked (the owner's batch in flight
//     commits first; its next one waits) and the directory row checked still moving at that
//     epoch (a cancelled move stops here); the cut-over then waits, holding the lock, until
//     the old shard's relay has published every outbox row committed there before the lock
//     (table mode: no row pending or packed with an id at or below the highest one then;
//     WAL mode: the outbox slot confirmed past the WAL position then), at most
//     o.DrainWithin (*DrainError past it, the move resumable): outbox rows do not record the
//     partition they came from, so the wait covers every partition's rows on that shard,
//     committed before the lock — the moved partition's are among them and no newer one can
//     be written there, its owner being held by the lock. Rows parked by the relay (outbox
//     parked) are not waited for: they stay on the old shard for an operator. Then, on the
//     target, in one transaction, any earlier copy is replaced by this one, a shard_move
//     audit row is written and o.Hook moves the user's rows; the target commits;
//  3. on the old shard, the state is deleted with a shard_move audit row in the transaction
//     that holds the lock, and commits: the old owner's next batch finds no watermark and is
//     fenced (its transaction rolls back); it re-reads the directory and continues on the
//     target from the moved watermark, whose relay publishes its new events after the old
//     shard's;
//  4. the directory row is set active on o.To.
//
// A crash or an error at any step leaves a row "moving" and the old shard authoritative
// until step 3 commits (consumers keep running there); calling Move again with the same o.To
// resumes, and CancelMove, before step 3 committed, puts the partition back. Both schemas
// must be at the same migration version.
func Move(ctx context.Context, set *Set, schema string, o MoveOptions) (Entry, error) {
	var e Entry
	if err := set.Validate(); err != nil {
		return e, err
	}
	if o.Reason == "" {
		return e, errors.New("shards: a move needs a reason (it is audited)")
	}
	if o.Actor == "" {
		o.Actor = "kafkatx shards move"
	}
	target := set.Pool(o.To)
	if target == nil {
		return e, fmt.Errorf("shards: --to %q is not one of the shards given (%v)", o.To, set.Names())
	}
	schema = pg.SchemaOr(schema)
	t := tables.For(schema)
	// Refused before the directory changes: a move that cannot run must leave nothing moving.
	if missing, err := migrations.Missing(ctx, target, schema); err != nil {
		return e, fmt.Errorf("shards: read shard %q's migrations: %w", o.To, err)
	} else if len(missing) > 0 {
		return e, fmt.Errorf("shards: shard %q is not migrated (versions %v missing): migrate it first (migrate up of kafkatx, with its --shard); nothing was changed", o.To, missing)
	}
	// 1. The directory: moving, epoch raised (or resumed).
	err := pgx.BeginFunc(ctx, set.Directory, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+entryCols+` FROM `+t.ShardDirectory+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, o.Group, o.Topic, o.Partition)
		if err != nil {
			return err
		}
		es, err := scanEntries(rows)
		if err != nil {
			return err
		}
		if len(es) == 0 {
			_, err := tx.Exec(ctx, `INSERT INTO `+t.ShardDirectory+` (group_id, topic, partition, shard) VALUES ($1, $2, $3, $4)`,
				o.Group, o.Topic, o.Partition, o.To)
			e = Entry{Group: o.Group, Topic: o.Topic, Partition: o.Partition, Shard: o.To, Epoch: 1, State: StateActive}
			return err
		}
		e = es[0]
		switch {
		case e.State == StateActive && e.Shard == o.To:
			return nil
		case e.State == StateMoving && e.MovingTo != o.To:
			return fmt.Errorf("shards: a move of partition %d of %s to shard %q is in progress: finish it with --to %s first", o.Partition, o.Topic, e.MovingTo, e.MovingTo)
		case set.Pool(e.Shard) == nil:
			return fmt.Errorf("partition %d of %s is on shard %q, which was not given (%v): nothing was changed", o.Partition, o.Topic, e.Shard, set.Names())
		case e.State == StateActive:
			return tx.QueryRow(ctx, `UPDATE `+t.ShardDirectory+` SET state = 'moving', moving_to = $4, epoch = epoch + 1, updated_at = now()
				WHERE group_id = $1 AND topic = $2 AND partition = $3 RETURNING epoch, state, coalesce(moving_to, '')`,
				o.Group, o.Topic, o.Partition, o.To).Scan(&e.Epoch, &e.State, &e.MovingTo)
		}
		return nil // moving to o.To already: resume
	})
	if err != nil {
		return e, fmt.Errorf("shards: move partition %d of %s: %w", o.Partition, o.Topic, err)
	}
	if err := testAfter("directory"); err != nil {
		return e, err
	}
	if e.State == StateActive {
		return e, nil // already there, or newly assigned
	}
	source := set.Pool(e.Shard)
	if source == nil {
		return e, fmt.Errorf("shards: partition %d of %s is on shard %q, which was not given (%v)", o.Partition, o.Topic, e.Shard, set.Names())
	}
	// 2 and 3. A deadlock with the owner's batch (the hook's rows) or another conflict is
	// tried again: the old shard stays authoritative meanwhile.
	for try := 1; ; try++ {
		err = copyState(ctx, set.Directory, source, target, t, e, o)
		if err == nil || !pg.LostRace(err) || try == moveTries {
			break
		}
	}
	if errors.Is(err, errCancelled) || errors.As(err, new(*StaleSourceError)) {
		return e, fmt.Errorf("shards: move partition %d of %s from %s to %s (epoch %d): %w", o.Partition, o.Topic, e.Shard, o.To, e.Epoch, err)
	}
	if err != nil {
		return e, fmt.Errorf("shards: move partition %d of %s from %s to %s (epoch %d; the row stays moving and %s authoritative: run the move again to resume, or cancel it): %w",
			o.Partition, o.Topic, e.Shard, o.To, e.Epoch, e.Shard, err)
	}
	// 4.
	err = set.Directory.QueryRow(ctx, `UPDATE `+t.ShardDirectory+` SET state = 'active', shard = moving_to, moving_to = NULL, updated_at = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND state = 'moving' AND epoch = $4
		RETURNING `+entryCols, o.Group, o.Topic, o.Partition, e.Epoch).Scan(&e.Group, &e.Topic, &e.Partition, &e.Shard, &e.Epoch, &e.State, &e.MovingTo, &e.UpdatedAt)
	if err != nil {
		return e, fmt.Errorf("shards: finish the move of partition %d of %s in the directory: %w", o.Partition, o.Topic, err)
	}
	return e, nil
}

// moveTries bounds Move's tries of its copy after a conflict (deadlock, serialization).
const moveTries = 5

// errCancelled is copyState's refusal when the directory row left the move's epoch (a
// cancel, or another mover finished it).
var errCancelled = errors.New("the directory row is no longer moving at this epoch: the move was cancelled or finished meanwhile (see kafkatx shards status)")

// testAfterStep, set by tests only, is called (testAfter) after each step of Move and CancelMove commits
// ("directory", "target", "source"; "cancel-target", "cancel-directory"): an error stops the
// mover there, as a crash would.
var testAfterStep func(step string) error

func testAfter(step string) error {
	if testAfterStep == nil {
		return nil
	}
	return testAfterStep(step)
}

// copyState is Move's steps 2 and 3: the partition's state copied to target and deleted on
// source, the watermark row on source locked throughout. A source without a watermark row
// was moved already (a resumed move after step 3): nothing is copied.
func copyState(ctx context.Context, dir, source, target *pgxpool.Pool, t tables.Names, e Entry, o MoveOptions) error {
	ftx, err := source.Begin(ctx)
	if err != nil {
		return err
	}
	defer ftx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	// The partition's lock first: a first run writing the partition's first watermark on the
	// source holds it until it commits, so a row it is writing is seen below and moved, never
	// left behind on a shard the directory no longer names (ConfirmFirstRun).
	if err := LockPartition(ctx, ftx, t.Schema, o.Group, o.Topic, o.Partition); err != nil {
		return err
	}
	var w int64
	err = ftx.QueryRow(ctx, `SELECT next_offset FROM `+t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
		o.Group, o.Topic, o.Partition).Scan(&w)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lock the watermark on %s: %w", e.Shard, err)
	}
	if err := checkNotStale(ctx, target, t, e, w); err != nil {
		return err
	}
	// A cancel holds this lock while it changes the directory: under it, the row is either
	// still moving at e's epoch (and stays so until this transaction ends) or cancelled.
	var still bool
	if err := dir.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t.ShardDirectory+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND state = 'moving' AND epoch = $4 AND moving_to = $5)`,
		o.Group, o.Topic, o.Partition, e.Epoch, o.To).Scan(&still); err != nil {
		return fmt.Errorf("read the shard directory: %w", err)
	}
	if !still {
		return errCancelled
	}
	if err := drainOutbox(ctx, source, t, e.Shard, o.DrainWithin); err != nil {
		return err
	}
	ttx, err := target.Begin(ctx)
	if err != nil {
		return err
	}
	defer ttx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	store := offsetstore.New(t.Schema)
	reason := fmt.Sprintf("partition moved from shard %s to shard %s at watermark %d (directory epoch %d): %s", e.Shard, o.To, w, e.Epoch, o.Reason)
	// The target's audit row first: a resumed move clears the copy an earlier try left there,
	// and that deletion is explained by this row (kafkatx.audit_id, migration 016's trigger),
	// not audited as a watermark deleted outside kafkatx (a false gap in offsets account).
	var earlier int64
	if err := ttx.QueryRow(ctx, `SELECT count(*) FROM `+t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3`,
		o.Group, o.Topic, o.Partition).Scan(&earlier); err != nil {
		return fmt.Errorf("read %s's watermark: %w", o.To, err)
	}
	treason := reason
	if earlier > 0 {
		treason += " (resumed: replaces the copy an earlier try of this move left here)"
	}
	tid, err := store.InsertEvent(ctx, ttx, offsetstore.Event{Group: o.Group, Topic: o.Topic, Partition: o.Partition,
		Kind: offsetstore.KindShardMove, From: w, To: w, Actor: o.Actor, Reason: treason})
	if err != nil {
		return err
	}
	if _, err := ttx.Exec(ctx, `SELECT set_config('kafkatx.audit_id', $1, true)`, strconv.FormatInt(tid, 10)); err != nil {
		return err
	}
	for _, tb := range t.PartitionState() {
		if err := copyTable(ctx, ftx, ttx, tb, o); err != nil {
			return err
		}
	}
	if o.Hook != nil {
		if err := o.Hook(ctx, ftx, ttx, o.Group, o.Topic, o.Partition); err != nil {
			return fmt.Errorf("the move hook: %w", err)
		}
	}
	id, err := store.InsertEvent(ctx, ftx, offsetstore.Event{Group: o.Group, Topic: o.Topic, Partition: o.Partition,
		Kind: offsetstore.KindShardMove, From: w, To: w, Actor: o.Actor, Reason: reason})
	if err != nil {
		return err
	}
	// The watermark's deletion below is explained by that row (migration 016's trigger).
	if _, err := ftx.Exec(ctx, `SELECT set_config('kafkatx.audit_id', $1, true)`, strconv.FormatInt(id, 10)); err != nil {
		return err
	}
	for _, tb := range t.PartitionState() {
		if _, err := ftx.Exec(ctx, `DELETE FROM `+tb.Quoted+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, o.Group, o.Topic, o.Partition); err != nil {
			return err
		}
	}
	if err := ttx.Commit(ctx); err != nil {
		return fmt.Errorf("commit on %s: %w", o.To, err)
	}
	if err := testAfter("target"); err != nil {
		return err
	}
	if err := ftx.Commit(ctx); err != nil {
		return fmt.Errorf("commit on %s (the copy on %s is replaced when the move is resumed): %w", e.Shard, o.To, err)
	}
	return testAfter("source")
}

// StaleSourceError is Move's and CancelMove's refusal when the shard a move leaves holds a
// watermark behind the target's: the move's cut-over committed and consumers applied on the
// target since, so the row on the shard it leaves is a stale copy (that shard restored from an
// older backup). Nothing is copied or deleted; an operator checks the copy and deletes it on
// that shard (docs/deployment.md), then runs the move again to finish it.
type StaleSourceError struct {
	Entry          Entry
	Source, Target int64 // the watermarks on Entry.Shard and Entry.MovingTo
}

func (e *StaleSourceError) Error() string {
	return fmt.Sprintf("shard %s holds partition %d of %s at watermark %d, behind shard %s's %d: the move's cut-over committed and consumers applied on %s since, so the row on %s is a stale copy (restored from an older backup?); "+
		"nothing was copied: check it and delete the partition's state on %s, then run the move again to finish it",
		e.Entry.Shard, e.Entry.Partition, e.Entry.Topic, e.Source, e.Entry.MovingTo, e.Target, e.Entry.MovingTo, e.Entry.Shard, e.Entry.Shard)
}

// checkNotStale refuses (*StaleSourceError) a source watermark w behind the target's.
func checkNotStale(ctx context.Context, target *pgxpool.Pool, t tables.Names, e Entry, w int64) error {
	var tw int64
	err := target.QueryRow(ctx, `SELECT next_offset FROM `+t.Watermarks+` WHERE group_id = $1 AND topic = $2 AND partition = $3`,
		e.Group, e.Topic, e.Partition).Scan(&tw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the watermark on %s: %w", e.MovingTo, err)
	}
	if tw > w {
		return &StaleSourceError{Entry: e, Source: w, Target: tw}
	}
	return nil
}

// copyTable replaces the partition's rows of table on to by its rows on from: every column but
// a serial id (a dead letter gets a new id on the target).
func copyTable(ctx context.Context, from, to pgx.Tx, tb tables.Table, o MoveOptions) error {
	table := tb.Quoted
	if _, err := to.Exec(ctx, `DELETE FROM `+table+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, o.Group, o.Topic, o.Partition); err != nil {
		return fmt.Errorf("clear an earlier copy in %s: %w", table, err)
	}
	rows, err := from.Query(ctx, `SELECT * FROM `+table+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, o.Group, o.Topic, o.Partition)
	if err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	var cols []string
	var keep []int
	for i, f := range rows.FieldDescriptions() {
		if f.Name == "id" {
			continue
		}
		cols = append(cols, f.Name)
		keep = append(keep, i)
	}
	var data [][]any
	for rows.Next() {
		vs, err := rows.Values()
		if err != nil {
			rows.Close()
			return fmt.Errorf("read %s: %w", table, err)
		}
		row := make([]any, len(keep))
		for j, i := range keep {
			row[j] = vs[i]
		}
		data = append(data, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	if len(data) == 0 {
		return nil
	}
	if _, err := to.CopyFrom(ctx, tb.Identifier, cols, pgx.CopyFromRows(data)); err != nil {
		return fmt.Errorf("write %s: %w", table, err)
	}
	return nil
}
