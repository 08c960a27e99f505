package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/outbox"
)

// Exit status of outbox release|discard and dlq replay|discard when the row is not in a
// state the command acts on (not parked, not found, already resolved).
const exitNotActionable = 6

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
			p.ID, p.Topic, p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, p.Waiting, p.LastError, j.Key, j.Value)
	}
	if c.Output == "text" && len(rows) == 0 {
		fmt.Println("no parked outbox rows")
	}
	return nil
}

// OutboxReleaseCmd releases a parked row.
type OutboxReleaseCmd struct {
	ID     int64  `arg:"" help:"Outbox row id (from outbox parked)."`
	Reason string `required:"" help:"Why (recorded in outbox_audit)."`
}

func (c *OutboxReleaseCmd) Run(ctx context.Context, g *Globals) error {
	return g.resolveParked(ctx, c.ID, "released", func(ctx context.Context, tx pgx.Tx, w outbox.Writer) error {
		return w.ReleaseTx(ctx, tx, c.ID, c.Reason, offsets.Actor())
	})
}

// OutboxDiscardCmd discards a parked row.
type OutboxDiscardCmd struct {
	ID     int64  `arg:"" help:"Outbox row id (from outbox parked)."`
	Reason string `required:"" help:"Why (recorded in outbox_audit)."`
}

func (c *OutboxDiscardCmd) Run(ctx context.Context, g *Globals) error {
	return g.resolveParked(ctx, c.ID, "discarded", func(ctx context.Context, tx pgx.Tx, w outbox.Writer) error {
		return w.DiscardTx(ctx, tx, c.ID, c.Reason, offsets.Actor())
	})
}

func (g *Globals) resolveParked(ctx context.Context, id int64, done string, f func(context.Context, pgx.Tx, outbox.Writer) error) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return f(ctx, tx, outbox.Writer{Schema: g.Schema}) })
	if errors.Is(err, outbox.ErrNotParked) {
		return &exitError{code: exitNotActionable, err: err}
	}
	if err != nil {
		return err
	}
	fmt.Printf("outbox row %d %s\n", id, done)
	return nil
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
