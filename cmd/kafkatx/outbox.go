package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/outbox"
)

// OutboxCmd groups the operator commands for parked outbox rows.
type OutboxCmd struct {
	Parked   OutboxParkedCmd   `cmd:"" help:"List rows the broker refused for good (too large, unknown topic, not authorized), with the rows waiting behind each."`
	Release  OutboxReleaseCmd  `cmd:"" help:"Put a parked row back in the queue (after fixing the topic or its limits)."`
	Discard  OutboxDiscardCmd  `cmd:"" help:"Give up on a parked row: never published; the rows of its key behind it flow again."`
	DropSlot OutboxDropSlotCmd `cmd:"" name:"drop-slot" help:"Drop the WAL outbox's replication slot (what it holds unpublished is lost)."`
}

// OutboxParkedCmd lists parked rows.
type OutboxParkedCmd struct {
	Limit     int    `default:"100" help:"Most rows listed."`
	ShowValue bool   `name:"show-value" help:"Print keys and values in full (they may hold personal data)."`
	Output    string `default:"text" enum:"text,json" help:"text or json (one object per line)."`
}

type parkedJSON struct {
	ID        int64     `json:"id"`
	OutboxID  string    `json:"outbox_id"`
	Topic     string    `json:"topic"`
	Partition *int32    `json:"partition,omitempty"`
	Key       bytesView `json:"key"`
	Value     bytesView `json:"value"`
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"created_at"`
	ParkedAt  time.Time `json:"parked_at"`
	Waiting   int64     `json:"waiting_behind"`
}

// Validate refuses a --limit outside 1 to 100,000.
func (c *OutboxParkedCmd) Validate() error { return flagcheck.Int("limit", c.Limit, 1, 100_000) }

func (c *OutboxParkedCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := outbox.Writer{Schema: g.Schema}.Parked(ctx, pool, c.Limit)
	if err != nil {
		return err
	}
	for _, p := range rows {
		j := parkedJSON{ID: p.ID, OutboxID: p.OutboxID, Topic: p.Topic, Partition: p.Partition,
			Key: viewBytes(p.Key, c.ShowValue, 64), Value: viewBytes(p.Value, c.ShowValue, valuePrefixBytes),
			Attempts: p.Attempts, Error: p.LastError, CreatedAt: p.CreatedAt, ParkedAt: p.ParkedAt, Waiting: p.Waiting}
		if c.Output == "json" {
			b, _ := json.Marshal(j)
			fmt.Println(string(b))
			continue
		}
		fmt.Printf("%d  topic=%s  parked=%s  attempts=%d  waiting_behind=%d\n    error: %s\n    key:   %s\n    value: %s\n",
			p.ID, termText(p.Topic), p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, p.Waiting, termText(p.LastError), j.Key, j.Value)
	}
	if c.Output == "text" && len(rows) == 0 {
		fmt.Println("no parked outbox rows")
	}
	return nil
}

// OutboxReleaseCmd releases one parked row, or every parked row (of a topic) with --all.
type OutboxReleaseCmd struct {
	ID int64 `arg:"" optional:"" help:"Outbox row id (from outbox parked); or --all."`
	outboxBulkFlags
}

// Help is the long help of outbox release.
func (OutboxReleaseCmd) Help() string {
	return `Puts parked rows back in the queue: one by id, or with --all every parked row (of --topic T)
in one audited statement (one outbox_audit row per row, with --reason and the OS user at the
host). --all prints what it will release (rows per topic, ids, since when) and then releases
those rows (parked rows up to the highest id it printed: none written after);
--dry-run prints only.

Exit status: 0 done (or nothing parked), 2 a usage error, 6 the row id is not parked, 1 an error.`
}

func (c *OutboxReleaseCmd) Validate() error { return c.validate(c.ID) }

func (c *OutboxReleaseCmd) Run(ctx context.Context, g *Globals) error {
	return g.resolveParked(ctx, c.ID, &c.outboxBulkFlags, "release", "released",
		func(ctx context.Context, tx pgx.Tx, w outbox.Writer) error {
			return w.ReleaseTx(ctx, tx, c.ID, c.Reason, offsets.Actor())
		}, outbox.Writer.ReleaseAllTx)
}

// OutboxDiscardCmd discards one parked row, or every parked row (of a topic) with --all.
type OutboxDiscardCmd struct {
	ID int64 `arg:"" optional:"" help:"Outbox row id (from outbox parked); or --all."`
	outboxBulkFlags
}

// Help is the long help of outbox discard.
func (OutboxDiscardCmd) Help() string {
	return `Gives up on parked rows: never published; the rows of their keys waiting behind them flow
again. One by id, or with --all every parked row (of --topic T) in one audited statement (one
outbox_audit row per row). --all prints what it will discard and then discards those rows (up to
the highest id it printed); --dry-run prints only.

Exit status: 0 done (or nothing parked), 2 a usage error, 6 the row id is not parked, 1 an error.`
}

func (c *OutboxDiscardCmd) Validate() error { return c.validate(c.ID) }

func (c *OutboxDiscardCmd) Run(ctx context.Context, g *Globals) error {
	return g.resolveParked(ctx, c.ID, &c.outboxBulkFlags, "discard", "discarded",
		func(ctx context.Context, tx pgx.Tx, w outbox.Writer) error {
			return w.DiscardTx(ctx, tx, c.ID, c.Reason, offsets.Actor())
		}, outbox.Writer.DiscardAllTx)
}

// outboxBulkFlags are the flags of outbox release and discard.
type outboxBulkFlags struct {
	All    bool   `help:"Every parked row (of --topic), in one audited statement, instead of one ID."`
	Topic  string `help:"With --all: only this topic's parked rows."`
	DryRun bool   `name:"dry-run" help:"Print what would be done and change nothing."`
	Reason string `required:"" help:"Why (recorded in outbox_audit)."`
}

func (f *outboxBulkFlags) validate(id int64) error {
	switch {
	case id != 0 && f.All:
		return errors.New("give a row ID or --all, not both")
	case id == 0 && !f.All:
		return errors.New("give a row ID (from `kafkatx outbox parked`) or --all [--topic T]")
	case id < 0:
		return fmt.Errorf("row ID %d: outbox row ids are positive", id)
	case f.Topic != "" && !f.All:
		return errors.New("--topic selects rows for --all; with a row ID leave it out")
	case strings.TrimSpace(f.Reason) == "":
		return errors.New("--reason is empty: say why (it is recorded in outbox_audit)")
	}
	return nil
}

type bulkParkedFunc func(outbox.Writer, context.Context, pgx.Tx, outbox.ParkedSelection, string, string) (int64, error)

func (g *Globals) resolveParked(ctx context.Context, id int64, f *outboxBulkFlags, verb, done string,
	one func(context.Context, pgx.Tx, outbox.Writer) error, all bulkParkedFunc) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := outbox.Writer{Schema: g.Schema}
	if f.All {
		return g.resolveAllParked(ctx, pool, w, f, verb, done, all)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := one(ctx, tx, w); err != nil {
			return err
		}
		if f.DryRun {
			return errDryRun // roll back: the row is parked and would be acted on
		}
		return nil
	})
	if errors.Is(err, outbox.ErrNotParked) {
		return &exitError{code: exitNotActionable, err: fmt.Errorf("%w (`kafkatx outbox parked` lists the parked rows)", err)}
	}
	if errors.Is(err, errDryRun) {
		fmt.Printf("dry run: outbox row %d is parked and would be %s; nothing changed\n", id, done)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Printf("outbox row %d %s\n", id, done)
	return nil
}

// errDryRun rolls back a transaction that did what a dry run only shows.
var errDryRun = errors.New("dry run")

func (g *Globals) resolveAllParked(ctx context.Context, pool *pgxpool.Pool, w outbox.Writer, f *outboxBulkFlags, verb, done string, all bulkParkedFunc) error {
	sel := outbox.ParkedSelection{Topic: f.Topic}
	sum, err := w.ParkedSummary(ctx, pool, sel)
	if err != nil {
		return err
	}
	var total int64
	for _, s := range sum {
		total += s.Rows
	}
	of := ""
	if f.Topic != "" {
		of = " of topic " + termText(f.Topic)
	}
	if total == 0 {
		fmt.Printf("no parked outbox rows%s: nothing to %s\n", of, verb)
		return nil
	}
	actor := offsets.Actor()
	fmt.Printf("plan: %s %d parked outbox row(s)%s, one outbox_audit row each\n  reason: %s\n  actor: %s\n", verb, total, of, termText(f.Reason), termText(actor))
	for _, s := range sum {
		fmt.Printf("  %s: %d row(s), ids %d..%d, parked since %s\n", termText(s.Topic), s.Rows, s.FirstID, s.LastID, s.OldestParkedAt.UTC().Format(time.RFC3339))
	}
	sel.MaxID = outbox.MaxIDOf(sum)
	return runBulk(ctx, pool, f.DryRun, verb, done, "parked outbox row(s)", total, func(tx pgx.Tx) (int64, error) {
		return all(w, ctx, tx, sel, f.Reason, actor)
	})
}

// outboxPool connects and checks that the outbox table exists.
func (g *Globals) outboxPool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkOutboxTable(ctx, pool, g.Schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
