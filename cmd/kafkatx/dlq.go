package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/offsets"
)

// DLQCmd groups the dead-letter commands. list and show never print a key, value or header
// value in full unless --show-value is given: size, SHA-256 and a short escaped prefix.
type DLQCmd struct {
	List    DLQListCmd    `cmd:"" help:"List dead letters (values summarized: size, sha256, short escaped prefix)."`
	Show    DLQShowCmd    `cmd:"" help:"Show one dead letter: origin, error, stack, headers, audit trail."`
	Replay  DLQReplayCmd  `cmd:"" help:"Re-publish a dead letter through the outbox (original key, value, headers) and mark it replayed."`
	Discard DLQDiscardCmd `cmd:"" help:"Mark a dead letter discarded."`
}

// DLQListCmd lists dead letters.
type DLQListCmd struct {
	Status     string `default:"new" enum:"new,replayed,discarded,all" help:"new, replayed, discarded or all."`
	Group      string `help:"Only this consumer group."`
	Topic      string `help:"Only this original topic."`
	ErrorClass string `name:"error-class" help:"Only this error class (permanent, max_attempts, panic, oversized, ...), as dlq replay|discard --all take it."`
	After      int64  `help:"Only ids above this (paging; with --shard, ids are each shard's own: page one shard with --from-shard)."`
	FromShard  string `name:"from-shard" help:"With --shard: list only this shard's dead letters (the next-page line over shards names it)."`
	Limit      int    `default:"100" help:"Most rows listed (1 to 100,000); when more match, a line on stderr says so and gives the --after of the next page."`
	ShowValue  bool   `name:"show-value" help:"Print keys and values in full (they may hold personal data)."`
	Output     string `default:"text" enum:"text,json" help:"text or json (one object per line)."`
}

// dlqJSON is a dead letter as list and show print it: dlq.View (the shape the console shares)
// with the key, value and headers as bytesView.
type dlqJSON struct {
	dlq.View
	Key     bytesView        `json:"key"`
	Value   bytesView        `json:"value"`
	Headers []headerJSON     `json:"headers,omitempty"`
	Stack   string           `json:"stack,omitempty"`
	Audit   []dlq.AuditEntry `json:"audit,omitempty"`
}

type headerJSON struct {
	Key   string    `json:"key"`
	Value bytesView `json:"value"`
}

func toDLQJSON(d *dlq.DeadLetter, full, details bool) dlqJSON {
	j := dlqJSON{View: dlq.ViewOf(d, details), Key: viewBytes(d.Key, full, 64), Value: viewBytes(d.Value, full, valuePrefixBytes)}
	if details {
		j.Stack = d.Stack
		for _, h := range d.Headers {
			j.Headers = append(j.Headers, headerJSON{Key: h.Key, Value: viewBytes(h.Value, full, valuePrefixBytes)})
		}
	}
	return j
}

// Validate refuses a --limit outside 1 to 100,000 and a negative --after.
func (c *DLQListCmd) Validate() error {
	if c.After < 0 {
		return fmt.Errorf("--after %d: want a dead letter id, 0 or more", c.After)
	}
	return flagcheck.Int("limit", c.Limit, 1, 100_000)
}

func (c *DLQListCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Sharded: each shard's dead letters in turn, each line naming its shard (ids are per
	// shard: --after and --limit apply to each, and a next page is one shard's: --from-shard).
	if c.FromShard != "" {
		specs, err := g.shardURLs()
		if err != nil {
			return err
		}
		known := false
		for _, sp := range specs {
			known = known || sp.name == c.FromShard
		}
		if !known {
			return &exitError{code: exitUsage, err: fmt.Errorf("--from-shard %s: not one of the shards given with --shard", termText(c.FromShard))}
		}
	}
	return g.eachShard(ctx, pool, nil, func(db shardDB) error {
		if c.FromShard != "" && db.shard != c.FromShard {
			return nil
		}
		return c.list(ctx, g, db.pool, db.shard)
	})
}

// list prints the dead letters of one database (shard: its name, "" unsharded).
func (c *DLQListCmd) list(ctx context.Context, g *Globals, pool *pgxpool.Pool, shard string) error {
	status := c.Status
	if status == "all" {
		status = ""
	}
	// One row more than --limit tells whether another page follows.
	found, err := dlq.Search(ctx, pool, g.Schema, dlq.Query{Filter: dlq.Filter{Status: status, Group: c.Group, Topic: c.Topic, AfterID: c.After, Limit: c.Limit + 1}, ErrorClass: c.ErrorClass})
	if err != nil {
		return err
	}
	more := len(found) > c.Limit
	if more {
		found = found[:c.Limit]
	}
	ds := make([]dlq.DeadLetter, len(found))
	for i := range found {
		ds[i] = found[i].DeadLetter
	}
	switch {
	case more && shard != "":
		defer fmt.Fprintf(os.Stderr, "kafkatx: dlq list: shard %s: the first %d dead letters shown (--limit %d); more match: the next page of this shard is --from-shard %s --after %d (or raise --limit)\n",
			termText(shard), c.Limit, c.Limit, shellQuote(shard), ds[len(ds)-1].ID)
	case more:
		defer fmt.Fprintf(os.Stderr, "kafkatx: dlq list: the first %d dead letters shown (--limit %d); more match: the next page is --after %d (or raise --limit)\n",
			c.Limit, c.Limit, ds[len(ds)-1].ID)
	}
	for i := range ds {
		j := toDLQJSON(&ds[i], c.ShowValue, false)
		if c.Output == "json" {
			b, _ := json.Marshal(j)
			if shard != "" { // the shard first, then the dead letter's own fields
				sb, _ := json.Marshal(shard)
				b = append(append([]byte(`{"shard":`), sb...), append([]byte(","), b[1:]...)...)
			}
			fmt.Println(string(b))
			continue
		}
		if shard != "" {
			fmt.Printf("shard=%s  ", termText(shard))
		}
		fmt.Printf("%d  %s  group=%s  %s[%d]@%d%s  attempts=%d  epoch=%d  last=%s  %s: %s\n    key:   %s\n    value: %s\n",
			j.ID, termText(j.Status), termText(j.Group), termText(j.Topic), j.Partition, j.Offset, logField("  topic_id=", j.TopicID), j.Attempts, j.ReplayEpoch,
			j.LastFailure.UTC().Format(time.RFC3339), termText(j.ErrorClass), termText(j.ErrorMessage), j.Key, j.Value)
	}
	if c.Output == "text" && len(ds) == 0 && shard != "" {
		fmt.Printf("shard %s: no dead letters\n", termText(shard))
	} else if c.Output == "text" && len(ds) == 0 {
		fmt.Println("no dead letters")
	}
	return nil
}

// DLQShowCmd shows one dead letter.
type DLQShowCmd struct {
	ID        int64  `arg:"" help:"Dead letter id."`
	ShowValue bool   `name:"show-value" help:"Print the key, value and header values in full (they may hold personal data)."`
	Output    string `default:"text" enum:"text,json" help:"text or json."`
}

// Validate refuses an id no dead letter has (ids are positive) before the database is asked
// (exit 2), as outbox release and dlq replay do.
func (c *DLQShowCmd) Validate() error {
	if c.ID <= 0 {
		return fmt.Errorf("dead letter ID %d: dead letter ids are positive (from `kafkatx dlq list`)", c.ID)
	}
	return nil
}

func (c *DLQShowCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := dlq.Get(ctx, pool, g.Schema, c.ID)
	if errors.Is(err, dlq.ErrNotFound) {
		return &exitError{code: exitNotActionable, err: err}
	}
	if err != nil {
		return err
	}
	j := toDLQJSON(d, c.ShowValue, true)
	if j.Audit, err = dlq.Audit(ctx, pool, g.Schema, c.ID); err != nil {
		return err
	}
	if c.Output == "json" {
		b, _ := json.Marshal(j)
		fmt.Println(string(b))
		return nil
	}
	fmt.Printf("dead letter %d (%s)\n  group:     %s\n  origin:    %s[%d]@%d\n", j.ID, termText(j.Status), termText(j.Group), termText(j.Topic), j.Partition, j.Offset)
	if j.TopicID != "" || j.ClusterID != "" {
		fmt.Printf("  log:       topic id %s, cluster id %s\n", orUnknown(j.TopicID), orUnknown(j.ClusterID))
	}
	if j.Timestamp != nil {
		fmt.Printf("  timestamp: %s\n", j.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	fmt.Printf("  key:       %s\n  value:     %s\n", j.Key, j.Value)
	for _, h := range j.Headers {
		fmt.Printf("  header:    %s = %s\n", termText(h.Key), h.Value)
	}
	fmt.Printf("  attempts:  %d (first failure %s, last %s, replay epoch %d)\n  error:     %s: %s\n", j.Attempts,
		j.FirstFailure.UTC().Format(time.RFC3339), j.LastFailure.UTC().Format(time.RFC3339), j.ReplayEpoch, termText(j.ErrorClass), termText(j.ErrorMessage))
	if j.Stack != "" {
		// One line of the stack per line, each escaped (a Go stack's tabs as spaces first).
		fmt.Println("  stack:")
		for _, line := range strings.Split(strings.TrimRight(j.Stack, "\n"), "\n") {
			fmt.Printf("    %s\n", termText(strings.ReplaceAll(line, "\t", "    ")))
		}
	}
	for _, a := range j.Audit {
		to := ""
		if a.ToTopic != "" {
			to = fmt.Sprintf(" to %s (outbox row %d)", termText(a.ToTopic), a.OutboxRow)
		}
		fmt.Printf("  audit:     %s %s%s by %s: %s\n", a.At.UTC().Format(time.RFC3339), termText(a.Action), to, termText(a.Actor), termText(a.Reason))
	}
	return nil
}

// DLQReplayCmd re-publishes one dead letter, or every one a selection picks with --all,
// through the outbox.
type DLQReplayCmd struct {
	ID      int64  `arg:"" optional:"" help:"Dead letter id; or --all with --topic, --group, --error-class, --since, --until."`
	ToTopic string `name:"to-topic" help:"Publish to this topic instead of the original one (default: the original topic, so its consumer runs the handler again)."`
	Again   bool   `help:"Also replay dead letters already replayed (never discarded ones)."`
	dlqBulkFlags
}

// Help is the long help of dlq replay.
func (DLQReplayCmd) Help() string {
	return `Writes a dead letter's original key, value and headers to the outbox (published by the relay)
and marks it replayed, with a dlq_audit row naming the outbox row; by id, or with --all every
new dead letter the filters select (--topic, --group, --error-class, --since, --until: the time
of its latest failure, RFC 3339 or a duration before now such as 2h). --all prints what it will
replay (per group, topic and error class) and then replays those (up to the highest id it
printed: none written after); --dry-run prints only.
A dead letter already replayed is replayed again only with --again.

Exit status: 0 done (or nothing selected), 2 a usage error, 6 no such dead letter or not in a
state to replay, 1 an error.`
}

func (c *DLQReplayCmd) Validate() error { return c.validate(c.ID) }

func (c *DLQReplayCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.All {
		return c.dlqBulk(ctx, pool, g.Schema, "replay", "replayed", c.Again, func(tx pgx.Tx, sel dlq.Selection, actor string) (int64, error) {
			return dlq.ReplayAllTx(ctx, tx, g.Schema, sel, dlq.Replay{ToTopic: c.ToTopic, Reason: c.Reason, Actor: actor, Again: c.Again})
		})
	}
	var row int64
	var d *dlq.DeadLetter
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		row, d, err = dlq.ReplayTx(ctx, tx, g.Schema, c.ID,
			dlq.Replay{ToTopic: c.ToTopic, Reason: c.Reason, Actor: offsets.Actor(), Again: c.Again})
		if err == nil && c.DryRun {
			return errDryRun
		}
		return err
	})
	if errors.Is(err, dlq.ErrResolved) && d == nil {
		if cur, gerr := dlq.Get(ctx, pool, g.Schema, c.ID); gerr == nil && cur.Status == dlq.StatusReplayed {
			err = fmt.Errorf("%w; to publish it once more: kafkatx dlq replay %d --again --reason %s", err, c.ID, shellQuote(c.Reason))
		}
	}
	if errors.Is(err, dlq.ErrNotFound) || errors.Is(err, dlq.ErrResolved) {
		return &exitError{code: exitNotActionable, err: err}
	}
	to := c.ToTopic
	if to == "" && d != nil {
		to = d.Topic
	}
	if errors.Is(err, errDryRun) {
		fmt.Printf("dry run: dead letter %d would be replayed to topic %s; nothing changed\n", c.ID, termText(to))
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Printf("dead letter %d replayed: outbox row %d to topic %s (published by the relay)\n", c.ID, row, termText(to))
	return nil
}

// DLQDiscardCmd discards one dead letter, or every new one a selection picks with --all.
type DLQDiscardCmd struct {
	ID int64 `arg:"" optional:"" help:"Dead letter id; or --all with --topic, --group, --error-class, --since, --until."`
	dlqBulkFlags
}

// Help is the long help of dlq discard.
func (DLQDiscardCmd) Help() string {
	return `Marks new dead letters discarded, each with a dlq_audit row: by id, or with --all every new
dead letter the filters select (--topic, --group, --error-class, --since, --until: the time of
its latest failure, RFC 3339 or a duration before now such as 2h), in one statement. --all
prints what it will discard and then discards those (up to the highest id it printed);
--dry-run prints only.

Exit status: 0 done (or nothing selected), 2 a usage error, 6 no such dead letter or not new, 1 an error.`
}

func (c *DLQDiscardCmd) Validate() error { return c.validate(c.ID) }

func (c *DLQDiscardCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if c.All {
		return c.dlqBulk(ctx, pool, g.Schema, "discard", "discarded", false, func(tx pgx.Tx, sel dlq.Selection, actor string) (int64, error) {
			return dlq.DiscardAllTx(ctx, tx, g.Schema, sel, dlq.Action{Reason: c.Reason, Actor: actor})
		})
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := dlq.DiscardTx(ctx, tx, g.Schema, c.ID, dlq.Action{Reason: c.Reason, Actor: offsets.Actor()})
		if err == nil && c.DryRun {
			return errDryRun
		}
		return err
	})
	if errors.Is(err, dlq.ErrNotFound) || errors.Is(err, dlq.ErrResolved) {
		return &exitError{code: exitNotActionable, err: err}
	}
	if errors.Is(err, errDryRun) {
		fmt.Printf("dry run: dead letter %d would be discarded; nothing changed\n", c.ID)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Printf("dead letter %d discarded\n", c.ID)
	return nil
}

// logField is label+id, or "" when id is unknown: a dead letter's log (dlq.View.TopicID) in
// a list line.
func logField(label, id string) string {
	if id == "" {
		return ""
	}
	return label + termText(id)
}

// orUnknown is s, or "unknown" when s is "".
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return termText(s)
}
