package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/shards"
)

// shardURL is one --shard NAME=URL.
type shardURL struct{ name, url string }

// shardURLs parses --shard NAME=URL (repeated, in order) with shards.ParseSpecs: a missing
// '=', a bad or repeated name, or a URL that does not parse is refused before anything
// connects; the message never quotes the URL.
func (g *Globals) shardURLs() ([]shardURL, error) {
	specs, err := shards.ParseSpecs(g.Shard)
	if err != nil {
		return nil, err
	}
	out := make([]shardURL, len(specs))
	for i, s := range specs {
		out[i] = shardURL{name: s.Name, url: s.URL}
	}
	return out, nil
}

// shardSet opens a pool on every --shard (shards.Open: a shard whose URL is --database-url's
// shares dir, the directory's pool) and returns the set, or nil without --shard; closeAll
// closes what it opened.
func (g *Globals) shardSet(ctx context.Context, dir *pgxpool.Pool) (set *shards.Set, closeAll func(), err error) {
	specs, err := shards.ParseSpecs(g.Shard)
	if err != nil || len(specs) == 0 {
		return nil, func() {}, err
	}
	if set, err = shards.Open(ctx, specs, shards.OpenOptions{Directory: dir, DirectoryURL: g.DatabaseURL}); err != nil {
		return nil, nil, err
	}
	return set, set.Close, nil
}

// ShardsCmd reads and changes the shard directory.
type ShardsCmd struct {
	Status ShardsStatusCmd `cmd:"" help:"Print the shard directory: each partition's shard, epoch and state (moves in progress), and each shard's watermarks."`
	Assign ShardsAssignCmd `cmd:"" help:"Map a partition that has no shard yet to a shard (a partition never assigned goes to the first --shard at its first assignment)."`
	Move   ShardsMoveCmd   `cmd:"" help:"Move a partition's kafkatx state to another shard while consumers run: fenced, resumable, cancellable before its cut-over (--cancel), audited as shard_move."`
}

// Help is the long help of shards.
func (ShardsCmd) Help() string {
	return `With --database-url naming the directory's database and --shard NAME=URL for each shard
(the flag repeated, in order), the same flags a sharded service runs with. The directory is
kafkatx's table shard_directory in --schema of --database-url's database; kafkatx migrate up
with the same flags creates it there and migrates every shard.`
}

func (g *Globals) needShards() error {
	if len(g.Shard) == 0 {
		return &exitError{code: exitUsage, err: errors.New("no shards: pass --shard NAME=URL for each shard, the flags the service runs with (see kafkatx shards --help)")}
	}
	return nil
}

// ShardsStatusCmd prints the directory.
type ShardsStatusCmd struct {
	Group  string `help:"Only this consumer group (default: every group)."`
	Output string `default:"text" enum:"text,json" help:"text or json (one object per line per partition: group, topic, partition, shard, epoch, state, moving_to, updated_at, the partition's watermark on its shard: watermark, -1 when it has none yet, and stale_copies: its watermark rows on shards the directory does not map it to, each {shard, watermark})."`
}

// shardRow is one line of shards status.
type shardRow struct {
	shards.Entry
	Watermark   int64               `json:"watermark"`
	StaleCopies []offsets.StaleCopy `json:"stale_copies,omitempty"`
}

func (c *ShardsStatusCmd) Run(ctx context.Context, g *Globals) error {
	set, closeAll, err := g.openShardsTo(ctx, "")
	if err != nil {
		return err
	}
	defer closeAll()
	es, err := shards.NewDirectory(set.Directory, g.Schema).List(ctx, c.Group)
	if err != nil {
		return err
	}
	rows := make([]shardRow, len(es))
	for i, e := range es {
		rows[i] = shardRow{Entry: e, Watermark: -1}
		pool := set.Pool(e.Shard)
		if pool == nil {
			continue // a shard these flags do not name: no watermark read
		}
		tp := offsetstore.TP{Topic: e.Topic, Partition: e.Partition}
		ws, err := offsetstore.New(g.Schema).Watermarks(ctx, pool, e.Group, []offsetstore.TP{tp})
		if err != nil {
			return fmt.Errorf("shard %s: %w", e.Shard, err)
		}
		if w, ok := ws[tp]; ok {
			rows[i].Watermark = w.Next
		}
	}
	copies, err := shards.StaleCopies(ctx, set, g.Schema, c.Group)
	if err != nil {
		return err
	}
	for _, sc := range copies {
		for i := range rows {
			if r := &rows[i]; r.Group == sc.Group && r.Topic == sc.Topic && r.Partition == sc.Partition {
				r.StaleCopies = append(r.StaleCopies, offsets.StaleCopy{Shard: sc.Shard, Watermark: sc.Watermark})
			}
		}
	}
	if c.Output == "json" {
		enc := json.NewEncoder(os.Stdout)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tSHARD\tEPOCH\tSTATE\tWATERMARK\tUPDATED\tSTALE COPIES")
	for _, r := range rows {
		state := r.State
		if r.MovingTo != "" {
			state += " to " + r.MovingTo
		}
		w := "-"
		if r.Watermark >= 0 {
			w = fmt.Sprint(r.Watermark)
		}
		staleText := "-"
		for j, sc := range r.StaleCopies {
			if j == 0 {
				staleText = ""
			} else {
				staleText += ", "
			}
			staleText += fmt.Sprintf("%s at %d", termText(sc.Shard), sc.Watermark)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", termText(r.Group), termText(r.Topic), r.Partition, termText(r.Shard), r.Epoch,
			termText(state), w, r.UpdatedAt.UTC().Format("2006-01-02T15:04:05Z"), staleText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(copies) > 0 {
		fmt.Printf("STALE COPY: %d watermark row(s) on shards the directory does not map their partition to (a shard restored from an older backup, or what a failed move left): consumers never apply there; check and delete them (docs/deployment.md, sharding)\n", len(copies))
	}
	return nil
}

// ShardsAssignCmd maps an unmapped partition to a shard.
type ShardsAssignCmd struct {
	Group     string `required:"" help:"Consumer group id."`
	Topic     string `required:"" help:"Topic."`
	Partition int32  `required:"" help:"Partition (>= 0)."`
	To        string `required:"" help:"The shard (a --shard NAME)."`
}

// Validate refuses a negative --partition (kong calls it after parsing).
func (c *ShardsAssignCmd) Validate() error {
	if c.Partition < 0 {
		return fmt.Errorf("--partition %d: want >= 0", c.Partition)
	}
	return nil
}

// openShardsTo is the preamble of shards status, assign and move: --shard required, the directory's
// pool and every shard's opened, and to (when not empty) one of the shards given. closeAll
// closes them.
func (g *Globals) openShardsTo(ctx context.Context, to string) (set *shards.Set, closeAll func(), err error) {
	if err := g.needShards(); err != nil {
		return nil, nil, err
	}
	dir, err := g.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	set, closeShards, err := g.shardSet(ctx, dir)
	if err != nil {
		dir.Close()
		return nil, nil, err
	}
	closeAll = func() { closeShards(); dir.Close() }
	if to != "" && set.Pool(to) == nil {
		closeAll()
		return nil, nil, fmt.Errorf("--to %q: not one of the shards given (%s)", to, strings.Join(set.Names(), ", "))
	}
	return set, closeAll, nil
}

func (c *ShardsAssignCmd) Run(ctx context.Context, g *Globals) error {
	if err := g.checkPartition(ctx, c.Topic, c.Partition); err != nil {
		return err
	}
	set, closeAll, err := g.openShardsTo(ctx, c.To)
	if err != nil {
		return err
	}
	defer closeAll()
	e, changed, err := shards.NewDirectory(set.Directory, g.Schema).Assign(ctx, c.Group, c.Topic, c.Partition, c.To)
	if err != nil {
		return err
	}
	what := "assigned to"
	if !changed {
		what = "already on"
	}
	fmt.Printf("partition %d of %s (group %s) %s shard %s (epoch %d)\n", e.Partition, termText(e.Topic), termText(e.Group), what, termText(e.Shard), e.Epoch)
	return nil
}

// ShardsMoveCmd moves a partition to another shard.
type ShardsMoveCmd struct {
	Group     string `required:"" help:"Consumer group id."`
	Topic     string `required:"" help:"Topic."`
	Partition int32  `required:"" help:"Partition (>= 0)."`
	To        string `help:"The target shard (a --shard NAME); required without --cancel, refused with it."`
	Reason    string `required:"" help:"Why (written to the shard_move or shard_move_cancel audit rows on both shards)."`
	Cancel    bool   `help:"Cancel the partition's move in progress instead (shards.CancelMove): back to active on the shard it is leaving, epoch raised, the target's copy deleted; refused (exit 6) when no move is in progress or it passed its cut-over."`
	// DrainWithin bounds the cut-over's wait for the old shard's relay (MoveOptions.DrainWithin).
	DrainWithin time.Duration `default:"60s" help:"At the cut-over, wait at most this long for the old shard's relay to publish the outbox rows committed there before it (a key's events keep their order across the move); past it the move fails and stays resumable."`
}

// Help is the long help of shards move.
func (ShardsMoveCmd) Help() string {
	return `Moves the partition's kafkatx state (watermark, attempts, done offsets, parked keys, dead
letters) to the target shard while consumers run (shards.Move): the directory row goes
"moving" with a higher epoch; on the old shard the watermark row is locked (the batch in
flight commits first), the state copied to the target with a shard_move audit row, then
deleted on the old shard in the transaction holding the lock, which fences the old owner's
next batch; the consumer re-reads the directory and continues on the target. A crash or an
error leaves the row "moving" and the old shard authoritative: run the same command again to
resume. Outbox rows already written stay on the old shard and its relay publishes them:
the cut-over waits (at most --drain-within, holding the partition) until it has, so the
target's relay never publishes a key's newer events before them. Idempotency keys stay
where they were claimed. Your own tables' rows of the partition are not moved by this
command: call shards.Move with a Hook from your code for that (docs).

With --cancel (and no --to), a move in progress that has not passed its cut-over is
cancelled: the row goes back to active on the shard it was leaving with its epoch raised,
and the state copied to the target is deleted there (audited as shard_move_cancel). Rows
your own hook copied to the target are not deleted by this command: call
shards.CancelMove with an Undo from your code for that. Once the cut-over committed (the
state deleted on the old shard) a cancel is refused with exit 6: finish the move.

Examples:
  kafkatx --database-url "$DIR_URL" --shard a="$A_URL" --shard b="$B_URL" \
    shards move --group orders --topic orders --partition 3 --to b --reason "rebalance a"
  kafkatx --database-url "$DIR_URL" --shard a="$A_URL" --shard b="$B_URL" \
    shards move --group orders --topic orders --partition 3 --cancel --reason "b is slow"`
}

// Validate refuses a negative --partition and an empty --reason (kong calls it after parsing).
func (c *ShardsMoveCmd) Validate() error {
	if c.Partition < 0 {
		return fmt.Errorf("--partition %d: want >= 0", c.Partition)
	}
	if strings.TrimSpace(c.Reason) == "" {
		return errors.New("--reason is empty: say why (it is audited)")
	}
	switch {
	case c.Cancel && c.To != "":
		return errors.New("--cancel takes no --to: it cancels the partition's move in progress, whichever its target")
	case !c.Cancel && c.To == "":
		return errors.New("missing flags: --to=STRING (or --cancel)")
	case c.DrainWithin <= 0:
		return fmt.Errorf("--drain-within %s: want > 0", c.DrainWithin)
	}
	return nil
}

func (c *ShardsMoveCmd) Run(ctx context.Context, g *Globals) error {
	if !c.Cancel {
		if err := g.checkPartition(ctx, c.Topic, c.Partition); err != nil {
			return err
		}
	}
	set, closeAll, err := g.openShardsTo(ctx, c.To)
	if err != nil {
		return err
	}
	defer closeAll()
	start := time.Now()
	if c.Cancel {
		e, err := shards.CancelMove(ctx, set, g.Schema, shards.CancelOptions{Group: c.Group, Topic: c.Topic, Partition: c.Partition, Reason: c.Reason})
		var notMoving *shards.NotMovingError
		var cut *shards.CutOverError
		if errors.As(err, &notMoving) || errors.As(err, &cut) {
			return &exitError{code: exitNotActionable, err: err}
		}
		if err != nil {
			return err
		}
		fmt.Printf("move cancelled: partition %d of %s (group %s) stays on shard %s (epoch %d, %s) in %s\n", e.Partition, termText(e.Topic), termText(e.Group), termText(e.Shard), e.Epoch,
			e.State, time.Since(start).Round(time.Millisecond))
		return nil
	}
	if e, err := shards.NewDirectory(set.Directory, g.Schema).Entry(ctx, c.Group, c.Topic, c.Partition); err != nil {
		return err
	} else if e != nil && e.State == shards.StateActive && e.Shard == c.To {
		fmt.Printf("partition %d of %s (group %s) is already on shard %s (epoch %d): nothing moved\n", e.Partition, termText(e.Topic), termText(e.Group), termText(e.Shard), e.Epoch)
		return nil
	}
	e, err := shards.Move(ctx, set, g.Schema, shards.MoveOptions{Group: c.Group, Topic: c.Topic, Partition: c.Partition, To: c.To, Reason: c.Reason,
		DrainWithin: c.DrainWithin})
	if err != nil {
		return err
	}
	fmt.Printf("partition %d of %s (group %s) on shard %s (epoch %d, %s) in %s\n", e.Partition, termText(e.Topic), termText(e.Group), termText(e.Shard), e.Epoch,
		e.State, time.Since(start).Round(time.Millisecond))
	return nil
}

// shardOperator is the offsets operator of one shard ("" when the command runs unsharded);
// set and schema, with --shard, are every shard's and the directory's (the same in each).
type shardOperator struct {
	shard  string
	op     *offsets.Operator
	set    *shards.Set
	schema string
}

// offsetsOperators is offsetsOperator for every shard given with --shard (each its own
// operator over one shared Kafka client), or the one database's without --shard.
func (g *Globals) offsetsOperators(ctx context.Context, withKafka bool) ([]shardOperator, func(), error) {
	op, closeOp, err := g.offsetsOperator(ctx, withKafka)
	if err != nil {
		return nil, nil, err
	}
	if len(g.Shard) == 0 {
		if err := g.checkDirectory(ctx, op.Pool()); err != nil {
			closeOp()
			return nil, nil, err
		}
		return []shardOperator{{op: op}}, closeOp, nil
	}
	dbs, closeShards, err := g.shardDBs(ctx, op.Pool(), offsetsCheckSchema)
	if err != nil {
		closeOp()
		return nil, nil, err
	}
	set := &shards.Set{Directory: op.Pool()}
	for _, db := range dbs {
		set.Shards = append(set.Shards, shards.Shard{Name: db.shard, Pool: db.pool})
	}
	out := make([]shardOperator, len(dbs))
	for i, db := range dbs {
		out[i] = shardOperator{shard: db.shard, op: op.On(db.pool), set: set, schema: g.Schema}
	}
	return out, func() { closeShards(); closeOp() }, nil
}

// shardErr prefixes err with its shard's name (none unsharded).
func shardErr(shard string, err error) error {
	if shard == "" || err == nil {
		return err
	}
	return fmt.Errorf("shard %s: %w", shard, err)
}

// shardStatus is offsets status over every shard (offsets.ShardedStatus), or the one
// database's without --shard.
func shardStatus(ctx context.Context, ops []shardOperator, group, topic string) ([]offsets.PartitionStatus, error) {
	if ops[0].set == nil {
		return ops[0].op.Status(ctx, group, topic)
	}
	sops := make([]offsets.ShardOperator, len(ops))
	for i, so := range ops {
		sops[i] = offsets.ShardOperator{Shard: so.shard, Op: so.op}
	}
	return offsets.ShardedStatus(ctx, ops[0].set, ops[0].schema, sops, group, topic)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// checkPartition refuses (usage status) a topic Kafka does not know or a partition it does not
// have, when --brokers is given: shards assign and move wrote a directory row for any triple
// and reported success (a fresh-eyes attack: partition 99, a topic that does not exist).
// Without --brokers nothing is checked (the directory may be prepared before the topic exists:
// the help says so). A Kafka that does not answer within --kafka-timeout is an error.
func (g *Globals) checkPartition(ctx context.Context, topic string, partition int32) error {
	if g.Brokers == "" {
		return nil
	}
	cfg, err := g.kafkaConfig("kafkatx-shards")
	if err != nil {
		return err
	}
	k, err := offsets.NewKafka(cfg, g.logger())
	if err != nil {
		return err
	}
	defer k.Close()
	kctx, cancel := context.WithTimeout(ctx, g.KafkaTimeout)
	defer cancel()
	ps, err := k.Partitions(kctx, topic)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return &exitError{code: exitUsage, err: fmt.Errorf("--topic %s: %w (checked against --brokers)", termText(topic), err)}
		}
		return err
	}
	for _, p := range ps {
		if p == partition {
			return nil
		}
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("--partition %d: topic %s has partitions 0 to %d (checked against --brokers)", partition, termText(topic), len(ps)-1)}
}
