package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/offsets"
)

// dlqBulkFlags are the selection and audit flags of dlq replay and discard.
type dlqBulkFlags struct {
	All        bool   `help:"Every new dead letter the filters select, instead of one ID."`
	Topic      string `help:"With --all: only dead letters of this original topic."`
	Group      string `help:"With --all: only this consumer group."`
	ErrorClass string `name:"error-class" help:"With --all: only this error class (as dlq list prints it: permanent, max_attempts, panic, ...)."`
	Since      string `help:"With --all: only dead letters whose latest failure is at or after this time (RFC 3339, or a duration before now such as 2h)." placeholder:"TIME"`
	Until      string `help:"With --all: only dead letters whose latest failure is before this time (RFC 3339, or a duration before now such as 30m)." placeholder:"TIME"`
	DryRun     bool   `name:"dry-run" help:"Print what would be done and change nothing."`
	Reason     string `required:"" help:"Why (recorded in dlq_audit)."`
}

func (f *dlqBulkFlags) validate(id int64) error {
	filters := f.Topic != "" || f.Group != "" || f.ErrorClass != "" || f.Since != "" || f.Until != ""
	switch {
	case id != 0 && f.All:
		return errors.New("give a dead letter ID or --all, not both")
	case id == 0 && !f.All:
		return errors.New("give a dead letter ID (from `kafkatx dlq list`) or --all [--topic T] [--group G] [--error-class C] [--since TIME] [--until TIME]")
	case id < 0:
		return fmt.Errorf("dead letter ID %d: ids are positive", id)
	case filters && !f.All:
		return errors.New("--topic, --group, --error-class, --since and --until select dead letters for --all; with an ID leave them out")
	case strings.TrimSpace(f.Reason) == "":
		return errors.New("--reason is empty: say why (it is recorded in dlq_audit)")
	}
	if _, err := f.selection(time.Now()); err != nil {
		return err
	}
	return nil
}

// selection turns the filters into a dlq.Selection; now anchors durations.
func (f *dlqBulkFlags) selection(now time.Time) (dlq.Selection, error) {
	sel := dlq.Selection{Topic: f.Topic, Group: f.Group, ErrorClass: f.ErrorClass}
	var err error
	if sel.Since, err = parseWhen("--since", f.Since, now); err != nil {
		return sel, err
	}
	if sel.Until, err = parseWhen("--until", f.Until, now); err != nil {
		return sel, err
	}
	if !sel.Since.IsZero() && !sel.Until.IsZero() && !sel.Since.Before(sel.Until) {
		return sel, fmt.Errorf("--since %s is not before --until %s: the range selects nothing", f.Since, f.Until)
	}
	return sel, nil
}

// parseWhen reads an RFC 3339 time or a positive duration before now; "" is the zero time.
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%s %s: want an RFC 3339 time (2026-12-01T09:00:00Z) or a positive duration before now (90m, 2h)", flag, shellQuote(v))
	}
	return now.Add(-d), nil
}

// dlqBulk prints the dry run of a bulk action, then, unless --dry-run, does it in one
// transaction bounded by the dry run's highest id.
func (f *dlqBulkFlags) dlqBulk(ctx context.Context, pool *pgxpool.Pool, schema, verb, done string, again bool,
	act func(pgx.Tx, dlq.Selection, string) (int64, error)) error {
	sel, err := f.selection(time.Now())
	if err != nil {
		return err
	}
	sel.Again = again
	sum, err := dlq.Summarize(ctx, pool, schema, sel)
	if err != nil {
		return err
	}
	var total int64
	for _, s := range sum {
		total += s.Count
	}
	what := "new"
	if again {
		what = "new or replayed"
	}
	if total == 0 {
		fmt.Printf("no %s dead letters match: nothing to %s\n", what, verb)
		return nil
	}
	actor := offsets.Actor()
	fmt.Printf("plan: %s %d %s dead letter(s), one dlq_audit row each\n  reason: %s\n  actor: %s\n", verb, total, what, termText(f.Reason), termText(actor))
	for _, s := range sum {
		fmt.Printf("  group %s, topic %s, %s: %d, ids %d..%d, failed %s .. %s\n", termText(s.Group), termText(s.Topic), termText(s.ErrorClass), s.Count,
			s.FirstID, s.LastID, s.Oldest.UTC().Format(time.RFC3339), s.Newest.UTC().Format(time.RFC3339))
	}
	sel.MaxID = dlq.MaxIDOf(sum)
	return runBulk(ctx, pool, f.DryRun, verb, done, "dead letter(s)", total, func(tx pgx.Tx) (int64, error) {
		return act(tx, sel, actor)
	})
}

// runBulk ends a bulk command after its printed plan: with dryRun it says nothing changed;
// otherwise it runs act in one transaction and prints how many of the total planned it
// acted on (done, e.g. "released"), naming the rows that someone else resolved meanwhile.
func runBulk(ctx context.Context, pool *pgxpool.Pool, dryRun bool, verb, done, noun string, total int64, act func(pgx.Tx) (int64, error)) error {
	if dryRun {
		fmt.Printf("dry run: nothing changed; run again without --dry-run to %s them\n", verb)
		return nil
	}
	var n int64
	start := time.Now()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		n, err = act(tx)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("%s %d %s in %.2fs", done, n, noun, time.Since(start).Seconds())
	if n != total {
		fmt.Printf(" (%d of those listed were resolved by someone else meanwhile)", total-n)
	}
	fmt.Println()
	return nil
}
