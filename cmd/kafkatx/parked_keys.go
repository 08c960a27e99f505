package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/cmd/kafkatx/console"
	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/engine"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// ParkedKeysCmd groups the commands on a consumer group's parked keys (Config.Park; table
// key_parking, package internal/parking): input messages of a key in trouble, set aside so
// that the partition's other keys go on. Not the outbox's parked rows (`kafkatx outbox parked`).
type ParkedKeysCmd struct {
	List       ParkedKeysListCmd       `cmd:"" help:"List a consumer group's parked keys per partition: key, head offset, parked messages, age, last error, next try."`
	Release    ParkedKeysReleaseCmd    `cmd:"" help:"Make a parked key's head due now (audited); with --all-keys every parked key of the partition, at most --rate a second."`
	DeadLetter ParkedKeysDeadLetterCmd `cmd:"" name:"dead-letter" help:"Dead-letter a parked key's head (or with --all every parked message of the key) in one audited transaction."`
}

// ClassParkedKeyOperator is the error class of a dead letter an operator wrote with
// `kafkatx parked-keys dead-letter` for a parked message that had not failed itself (one
// parked behind its key's head); a message that failed keeps its own class and error.
const ClassParkedKeyOperator = "operator"

// maxAuditOffsets bounds the offsets an offset_audit reason lists (the range says the rest).
const maxAuditOffsets = 20

// ParkedKeysListCmd lists parked keys.
type ParkedKeysListCmd struct {
	Group     string `required:"" help:"Consumer group id."`
	Topic     string `help:"Only this topic (default: every topic of the group)."`
	Partition int32  `default:"-1" help:"Only this partition (default: every partition)."`
	Limit     int    `default:"1000" help:"Most keys listed (1 to 100,000); when more are parked, a line on stderr says so."`
	ShowValue bool   `name:"show-value" help:"Print keys in full (they may hold personal data)."`
	Output    string `default:"text" enum:"text,json" help:"text or json (one object per line)."`
}

// Help is the long help of parked-keys list.
func (ParkedKeysListCmd) Help() string {
	return `Lists the parked keys of a consumer group (Config.Park), partition by partition, each with
its head (the lowest parked offset, tried next), how many messages of the key are parked, the
head's age (since it was parked), attempts, last error and next try ("now" when due). Keys are
summarized (size, SHA-256, a short escaped prefix) unless --show-value is given; key_hash is the
key's identity for release and dead-letter (--key-hash).
With --brokers (or KAFKA_BOOTSTRAP_SERVERS) it also marks a partition BLOCKED by a key at
offset X: it has parked keys, lag, and a watermark X that has not moved for 2m; the key named is
the one with the most parked messages (the consumer's log names the exact one). Without Kafka
the list is printed without that mark.
With --shard NAME=URL ... every shard's parked keys are listed in turn, each naming its shard
(a "shard" field first in JSON, shard=NAME before each partition in text); --limit applies per
shard.`
}

// Validate refuses a --limit outside 1 to 100,000 and a partition below -1.
func (c *ParkedKeysListCmd) Validate() error {
	if c.Partition < -1 {
		return fmt.Errorf("--partition %d: want a partition, 0 or more (leave it out for every partition)", c.Partition)
	}
	return flagcheck.Int("limit", c.Limit, 1, 100_000)
}

// parkedKeyJSON is a parked key as list prints it.
type parkedKeyJSON struct {
	Group      string     `json:"group"`
	Topic      string     `json:"topic"`
	Partition  int32      `json:"partition"`
	Key        bytesView  `json:"key"`
	KeyHash    string     `json:"key_hash"`
	HeadOffset int64      `json:"head_offset"`
	Count      int        `json:"count"`
	ParkedAt   time.Time  `json:"parked_at"`
	AgeSeconds int64      `json:"age_seconds"`
	Attempts   int        `json:"attempts"`
	ErrorClass string     `json:"error_class,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
	NextTry    *time.Time `json:"next_try"` // null: due now
	// BlockedAt is set on the key its partition is blocked by (console.BlockingKey): the
	// watermark the partition waits at. Only when Kafka is reachable (--brokers).
	BlockedAt *int64 `json:"blocked_at,omitempty"`
}

func toParkedKeyJSON(k parking.Key, full bool, now time.Time) parkedKeyJSON {
	j := parkedKeyJSON{Group: k.Group, Topic: k.Topic, Partition: k.Partition, Key: viewBytes(k.Key, full, 64),
		KeyHash: hex.EncodeToString(k.KeyHash), HeadOffset: k.HeadOffset, Count: k.Count, ParkedAt: k.ParkedAt,
		AgeSeconds: int64(now.Sub(k.ParkedAt).Seconds()), Attempts: k.Attempts, ErrorClass: k.ErrorClass, LastError: k.LastError}
	if !k.NextTry.IsZero() && k.NextTry.After(now) {
		t := k.NextTry
		j.NextTry = &t
	}
	return j
}

func (c *ParkedKeysListCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.parkingPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Sharded: each shard's parked keys in turn, each naming its shard (--limit applies to
	// each shard).
	return g.eachShard(ctx, pool, checkParkingTable, func(db shardDB) error { return c.list(ctx, g, db.pool, db.shard) })
}

// list prints the parked keys of one database (shard: its name, "" unsharded).
func (c *ParkedKeysListCmd) list(ctx context.Context, g *Globals, pool *pgxpool.Pool, shard string) error {
	st := parking.New(g.Schema)
	totals, err := st.Totals(ctx, pool, c.Group, c.Topic)
	if err != nil {
		return err
	}
	var topics []string
	for _, p := range totals {
		if len(topics) == 0 || topics[len(topics)-1] != p.Topic {
			topics = append(topics, p.Topic)
		}
	}
	now := time.Now()
	var keys []parking.Key
	for _, topic := range topics {
		// One key more than --limit tells whether the list is cut.
		ks, err := st.Keys(ctx, pool, c.Group, topic, c.Partition, c.Limit+1-len(keys))
		if err != nil {
			return err
		}
		keys = append(keys, ks...)
		if len(keys) > c.Limit {
			break
		}
	}
	if len(keys) > c.Limit {
		keys = keys[:c.Limit]
		on := ""
		if shard != "" {
			on = " on shard " + termText(shard)
		}
		defer fmt.Fprintf(os.Stderr, "kafkatx: parked-keys list: the first %d parked keys%s shown (--limit %d); more are parked: narrow with --topic and --partition, or raise --limit\n",
			c.Limit, on, c.Limit)
	}
	blocked := c.blocked(ctx, g, pool, topics, keys, now)
	if c.Output == "json" {
		for _, k := range keys {
			j := toParkedKeyJSON(k, c.ShowValue, now)
			if b, ok := blocked[partKey{k.Topic, k.Partition}]; ok && string(b.key) == string(k.KeyHash) {
				j.BlockedAt = &b.at
			}
			b, _ := json.Marshal(j)
			if shard != "" { // the shard first, then the key's own fields
				sb, _ := json.Marshal(shard)
				b = append(append([]byte(`{"shard":`), sb...), append([]byte(","), b[1:]...)...)
			}
			fmt.Println(string(b))
		}
		return nil
	}
	if len(keys) == 0 && shard != "" {
		fmt.Printf("shard %s: no parked keys\n", termText(shard))
		return nil
	}
	if len(keys) == 0 {
		fmt.Println("no parked keys")
		return nil
	}
	last := -1
	for i, k := range keys {
		if i == 0 || k.Topic != keys[i-1].Topic || k.Partition != keys[i-1].Partition {
			for j := last + 1; j < len(totals); j++ {
				if t := totals[j]; t.Topic == k.Topic && t.Partition == k.Partition {
					if shard != "" {
						fmt.Printf("shard=%s  ", termText(shard))
					}
					fmt.Printf("%s[%d]: %d parked keys, %d parked messages, oldest parked %s ago\n", termText(k.Topic), k.Partition,
						t.Keys, t.Messages, ageText(now.Sub(t.Oldest)))
					if b, ok := blocked[partKey{k.Topic, k.Partition}]; ok {
						fmt.Printf("  BLOCKED by key_hash %x at offset %d: the watermark has not moved for %v with lag %d (the consumer's log names the key it waits on)\n",
							b.key, b.at, console.BlockedAfter, b.lag)
					}
					last = j
					break
				}
			}
		}
		j := toParkedKeyJSON(k, c.ShowValue, now)
		next := "now"
		if j.NextTry != nil {
			next = fmt.Sprintf("%s (in %s)", j.NextTry.UTC().Format(time.RFC3339), ageText(j.NextTry.Sub(now)))
		}
		errText := "none yet"
		if k.ErrorClass != "" || k.LastError != "" {
			errText = termText(k.ErrorClass) + ": " + termText(k.LastError)
		}
		fmt.Printf("  head %d  count %d  age %s  attempts %d  next try %s\n    key:        %s\n    key_hash:   %s\n    last error: %s\n",
			k.HeadOffset, k.Count, ageText(now.Sub(k.ParkedAt)), k.Attempts, next, j.Key, j.KeyHash, errText)
	}
	return nil
}

type partKey struct {
	topic     string
	partition int32
}

type blockedBy struct {
	key     []byte // key hash
	at, lag int64
}

// blocked finds the partitions of keys that are blocked by a parked key (console.BlockingKey)
// when Kafka is reachable (--brokers; the lag needs the log end); without it, or when Kafka
// does not answer, nil (a line on stderr says why for the latter). The watermarks are read on
// pool (the keys' shard).
func (c *ParkedKeysListCmd) blocked(ctx context.Context, g *Globals, pool *pgxpool.Pool, topics []string, keys []parking.Key, now time.Time) map[partKey]blockedBy {
	if g.Brokers == "" || len(keys) == 0 {
		return nil
	}
	op, closeAll, err := g.offsetsOperator(ctx, true)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kafkatx: parked-keys list: whether a partition is blocked is not shown: %s\n", errLine(err))
		return nil
	}
	defer closeAll()
	op = op.On(pool)
	byPart := map[partKey][]parking.Key{}
	for _, k := range keys {
		byPart[partKey{k.Topic, k.Partition}] = append(byPart[partKey{k.Topic, k.Partition}], k)
	}
	out := map[partKey]blockedBy{}
	for _, t := range topics {
		sts, err := op.Status(ctx, c.Group, t)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kafkatx: parked-keys list: whether a partition of %s is blocked is not shown: %s\n", termText(t), errLine(err))
			continue
		}
		for _, s := range sts {
			pk := partKey{s.Topic, s.Partition}
			if k, ok := console.BlockingKey(s, byPart[pk], now); ok {
				out[pk] = blockedBy{key: k.KeyHash, at: *s.Watermark, lag: s.Lag}
			}
		}
	}
	return out
}

// ageText writes d rounded to the second (0s for a negative d: clocks of two hosts).
func ageText(d time.Duration) string { return max(d, 0).Round(time.Second).String() }

// parkedKeyFlags name one parked key of one partition, and the audit of an action on it.
type parkedKeyFlags struct {
	Group     string `required:"" help:"Consumer group id."`
	Topic     string `required:"" help:"Topic."`
	Partition int32  `required:"" placeholder:"P" help:"Partition of the parked key (parked-keys list prints it)."`
	Key       string `help:"The key, as its text; a key that is not text, an empty or a nil key: --key-hash."`
	KeyHash   string `name:"key-hash" help:"The key's hash as parked-keys list prints it (key_hash, 64 hex digits)."`
	Reason    string `required:"" help:"Why (recorded in the offset audit)."`
	DryRun    bool   `name:"dry-run" help:"Print what would be done and change nothing."`
}

// validate checks the flags; allKeys is release's --all-keys (no key then).
func (f *parkedKeyFlags) validate(allKeys bool) error {
	switch {
	case f.Partition < 0:
		return fmt.Errorf("--partition %d: give the partition of the parked key, 0 or more (parked-keys list prints it)", f.Partition)
	case f.Key != "" && f.KeyHash != "":
		return errors.New("give --key or --key-hash, not both")
	case allKeys && (f.Key != "" || f.KeyHash != ""):
		return errors.New("--all-keys acts on every parked key of the partition: leave out --key and --key-hash")
	case !allKeys && f.Key == "" && f.KeyHash == "":
		return errors.New("give the parked key: --key K (its text) or --key-hash H (from `kafkatx parked-keys list`)")
	case strings.TrimSpace(f.Reason) == "":
		return errors.New("--reason is empty: say why (it is recorded in the offset audit)")
	}
	if f.KeyHash != "" {
		if b, err := hex.DecodeString(f.KeyHash); err != nil || len(b) != 32 {
			return fmt.Errorf("--key-hash %s: want 64 hex digits, the key_hash parked-keys list prints", shellQuote(f.KeyHash))
		}
	}
	return nil
}

// keyHash is the parked key's hash (parking.KeyHash of --key, or --key-hash).
func (f *parkedKeyFlags) keyHash() []byte {
	if f.KeyHash != "" {
		b, _ := hex.DecodeString(f.KeyHash)
		return b
	}
	return parking.KeyHash([]byte(f.Key), 0)
}

// what names the key in messages.
func (f *parkedKeyFlags) what(h []byte) string {
	if f.Key != "" {
		return fmt.Sprintf("key %s (key_hash %x) of %s[%d]", termText(f.Key), h, termText(f.Topic), f.Partition)
	}
	return fmt.Sprintf("key_hash %x of %s[%d]", h, termText(f.Topic), f.Partition)
}

// errNotParked is an action's refusal when the key has no parked message (exit 6).
var errNotParked = errors.New("no parked message of this key: it is not parked (its consumer may have run it meanwhile); see `kafkatx parked-keys list`")

// ParkedKeysReleaseCmd makes a parked key's head due now.
type ParkedKeysReleaseCmd struct {
	parkedKeyFlags
	AllKeys bool `name:"all-keys" help:"Every parked key of the partition (after the far side recovered), at most --rate a second."`
	Rate    int  `default:"${redrive_rate}" help:"With --all-keys: most keys released a second (1 to ${redrive_rate_max}), as the console's bulk redrive, so that a recovered far side is not met by every key at once."`
}

// Help is the long help of parked-keys release.
func (ParkedKeysReleaseCmd) Help() string {
	return `Makes a parked key's head (its lowest parked offset) due now, its attempts kept: the consumer
that owns the partition runs it at its next look (within a second or so), then the key's later
parked messages in offset order. Each key released writes an offset_audit row of kind
` + offsetstore.KindParkedKeyReleased + ` (actor: the OS user at the host; reason: the key's hash and --reason);
the watermark does not move. --all-keys releases every parked key of the partition, one
transaction each, at most --rate a second; it prints the plan first, and --dry-run prints only.

Exit status: 0 done (or nothing parked with --all-keys), 2 a usage error, 6 the key has no
parked message, 1 an error.`
}

func (c *ParkedKeysReleaseCmd) Validate() error {
	if err := c.validate(c.AllKeys); err != nil {
		return err
	}
	if err := flagcheck.Int("rate", c.Rate, 1, console.MaxRedriveRate); err != nil {
		return err
	}
	return nil
}

func (c *ParkedKeysReleaseCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.parkingPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, actor := parking.New(g.Schema), offsets.Actor()
	if !c.AllKeys {
		h := c.keyHash()
		head, err := c.releaseOne(ctx, pool, g.Schema, h, -1, actor)
		if errors.Is(err, errNotParked) {
			return &exitError{code: exitNotActionable, err: fmt.Errorf("%s: %w", c.what(h), err)}
		}
		if errors.Is(err, errDryRun) {
			fmt.Printf("dry run: the head of %s (offset %d) would be due now; nothing changed\n", c.what(h), head)
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Printf("released %s: its head, offset %d, is due now (its consumer runs it at its next look)\n", c.what(h), head)
		return nil
	}
	keys, err := st.Keys(ctx, pool, c.Group, c.Topic, c.Partition, 0)
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		fmt.Printf("no parked keys in %s[%d] of group %s: nothing to release\n", termText(c.Topic), c.Partition, termText(c.Group))
		return nil
	}
	fmt.Printf("plan: release %d parked key(s) of %s[%d], group %s, heads due now, one offset_audit row each, at most %d a second\n  reason: %s\n  actor: %s\n",
		len(keys), termText(c.Topic), c.Partition, termText(c.Group), c.Rate, termText(c.Reason), termText(actor))
	for _, k := range keys {
		fmt.Printf("  head %d  count %d  key_hash %x  key %s\n", k.HeadOffset, k.Count, k.KeyHash, viewBytes(k.Key, false, 64))
	}
	if c.DryRun {
		fmt.Println("dry run: nothing changed; run again without --dry-run to release them")
		return nil
	}
	start, every := time.Now(), time.Second/time.Duration(c.Rate)
	n, gone := 0, 0
	for i, k := range keys {
		if i > 0 { // the rate limit: key i starts no sooner than i/rate after the first
			if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
				select {
				case <-ctx.Done():
					return fmt.Errorf("stopped after releasing %d of %d parked keys: %w", n, len(keys), ctx.Err())
				case <-time.After(wait):
				}
			}
		}
		_, err := c.releaseOne(ctx, pool, g.Schema, k.KeyHash, k.HeadOffset, actor)
		switch {
		case errors.Is(err, errNotParked):
			gone++
		case err != nil:
			return fmt.Errorf("after releasing %d of %d parked keys: %w", n, len(keys), err)
		default:
			n++
		}
	}
	fmt.Printf("released %d parked key(s) in %.2fs", n, time.Since(start).Seconds())
	if gone > 0 {
		fmt.Printf(" (%d of those listed were no longer parked)", gone)
	}
	fmt.Println()
	return nil
}

// releaseOne releases key h and writes its audit row in one transaction (rolled back, with
// errDryRun, under --dry-run), returning the head's offset: head when known (--all-keys' list,
// read once for the partition rather than once a key: a head the consumer ran since is
// audited as listed, while the key's next message is made due), else (head < 0) read in the
// transaction.
func (c *ParkedKeysReleaseCmd) releaseOne(ctx context.Context, pool *pgxpool.Pool, schema string, h []byte, head int64, actor string) (int64, error) {
	st := parking.New(schema)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if head < 0 {
			var err error
			if head, err = headOf(ctx, tx, st, c.Group, c.Topic, c.Partition, h); err != nil {
				return err
			}
		}
		ok, err := st.Release(ctx, tx, c.Group, c.Topic, c.Partition, h)
		if err != nil {
			return err
		}
		if !ok {
			return errNotParked
		}
		if _, err := offsetstore.New(schema).InsertEvent(ctx, tx, offsetstore.Event{Group: c.Group, Topic: c.Topic, Partition: c.Partition,
			Kind: offsetstore.KindParkedKeyReleased, From: head, To: head + 1, Reason: fmt.Sprintf("key_hash %x: %s", h, c.Reason), Actor: actor}); err != nil {
			return err
		}
		if c.DryRun {
			return errDryRun
		}
		return nil
	})
	return head, err
}

// headOf returns the head offset of parked key h of a partition, or errNotParked.
func headOf(ctx context.Context, tx pgx.Tx, st *parking.Store, group, topic string, partition int32, h []byte) (int64, error) {
	keys, err := st.Keys(ctx, tx, group, topic, partition, 0)
	if err != nil {
		return 0, err
	}
	for _, k := range keys {
		if string(k.KeyHash) == string(h) {
			return k.HeadOffset, nil
		}
	}
	return 0, errNotParked
}

// ParkedKeysDeadLetterCmd dead-letters a parked key's head, or all its parked messages.
type ParkedKeysDeadLetterCmd struct {
	parkedKeyFlags
	All bool `help:"Every parked message of the key, not only its head."`
}

// Help is the long help of parked-keys dead-letter.
func (ParkedKeysDeadLetterCmd) Help() string {
	return `Gives up on a parked key's head (its lowest parked offset), or with --all on every parked
message of the key: in one transaction each is written to the dead-letter table (its bytes,
headers, attempts and last error; a message parked behind the head that never ran gets the
error class ` + ClassParkedKeyOperator + `), its parked row deleted, and one offset_audit row of kind
` + offsetstore.KindParkedKeyDeadLettered + ` written (actor: the OS user at the host; reason: the key's hash, the
offsets and --reason). The consumer that owns the partition notices at its next look and runs
the key's next parked message, if any. The dead letters stay in the database (the command
does not know the consumer's Config.DeadLetter.Topic): kafkatx dlq list|replay acts on them.
--dry-run runs the same transaction and rolls it back.

Exit status: 0 done, 2 a usage error, 6 the key has no parked message, 1 an error.`
}

func (c *ParkedKeysDeadLetterCmd) Validate() error { return c.validate(false) }

func (c *ParkedKeysDeadLetterCmd) Run(ctx context.Context, g *Globals) error {
	pool, err := g.parkingPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, ost, actor, h := parking.New(g.Schema), offsetstore.New(g.Schema), offsets.Actor(), c.keyHash()
	var taken []parking.Message
	var ids []int64
	left := 0
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ws, err := ost.Watermarks(ctx, tx, c.Group, []offsetstore.TP{{Topic: c.Topic, Partition: c.Partition}})
		if err != nil {
			return err
		}
		epoch := ws[offsetstore.TP{Topic: c.Topic, Partition: c.Partition}].ReplayEpoch
		now := time.Now()
		if _, err := st.TakeKeyTx(ctx, tx, c.Group, c.Topic, c.Partition, h, c.All, func(m parking.Message) error {
			a := offsetstore.Attempt{Offset: m.Offset, Attempts: m.Attempts, FirstFailureAt: m.FirstFailureAt, LastFailureAt: now,
				ErrorClass: m.ErrorClass, ErrorMessage: m.LastError}
			if a.ErrorClass == "" {
				a.ErrorClass = ClassParkedKeyOperator
				a.ErrorMessage = "dead-lettered by an operator with its parked key before it ran: " + c.Reason
			}
			var hs []dlq.Header
			for _, hd := range m.Headers {
				hs = append(hs, dlq.Header{Key: hd.Key, Value: hd.Value})
			}
			d := engine.NewDeadLetter(c.Group, idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value},
				m.Timestamp, hs, a, epoch)
			if err := engine.DeadLetterTx(ctx, tx, g.Schema, d, nil); err != nil {
				return err
			}
			taken, ids = append(taken, m), append(ids, d.ID)
			return nil
		}); err != nil {
			return err
		}
		if len(taken) == 0 {
			return errNotParked
		}
		offs := make([]string, 0, maxAuditOffsets)
		for i, m := range taken {
			if i == maxAuditOffsets {
				offs = append(offs, fmt.Sprintf("… (%d in all)", len(taken)))
				break
			}
			offs = append(offs, fmt.Sprint(m.Offset))
		}
		if _, err := ost.InsertEvent(ctx, tx, offsetstore.Event{Group: c.Group, Topic: c.Topic, Partition: c.Partition,
			Kind: offsetstore.KindParkedKeyDeadLettered, From: taken[0].Offset, To: taken[len(taken)-1].Offset + 1,
			Reason: fmt.Sprintf("key_hash %x, offsets %s: %s", h, strings.Join(offs, ", "), c.Reason), Actor: actor}); err != nil {
			return err
		}
		rest, err := st.Keys(ctx, tx, c.Group, c.Topic, c.Partition, 0)
		if err != nil {
			return err
		}
		for _, k := range rest {
			if string(k.KeyHash) == string(h) {
				left = k.Count
			}
		}
		if c.DryRun {
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errNotParked) {
		return &exitError{code: exitNotActionable, err: fmt.Errorf("%s: %w", c.what(h), err)}
	}
	if err != nil && !errors.Is(err, errDryRun) {
		return err
	}
	verb := "dead-lettered"
	if c.DryRun {
		verb = "dry run: would dead-letter"
	}
	fmt.Printf("%s %d parked message(s) of %s:\n", verb, len(taken), c.what(h))
	for i, m := range taken {
		if c.DryRun {
			fmt.Printf("  offset %d  attempts %d\n", m.Offset, m.Attempts)
		} else {
			fmt.Printf("  offset %d  attempts %d  dead letter %d\n", m.Offset, m.Attempts, ids[i])
		}
	}
	switch {
	case c.DryRun:
		fmt.Println("dry run: nothing changed")
	case left > 0:
		fmt.Printf("%d parked message(s) of the key remain; its consumer runs the next at its next look\n", left)
	default:
		fmt.Println("the key has no parked message left: its next messages run as they arrive")
	}
	return nil
}

// parkingPool connects and checks that the schema has the parked keys' table (migration 013).
func (g *Globals) parkingPool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkParkingTable(ctx, pool, g.Schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// checkParkingTable checks that schema has the parked keys' table (migration 013) on pool.
func checkParkingTable(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tables.For(schema).KeyParking).Scan(&ok); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if !ok {
		return fmt.Errorf("schema %q has no parked keys' table (key_parking): run `kafkatx migrate up --schema %s` first", schema, shellQuote(schema))
	}
	return nil
}
