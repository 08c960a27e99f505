// Package shards maps a consumer group's partitions to PostgreSQL databases ("shards") by a
// directory, so one service can keep its state and apply its messages on more than one
// primary (docs/deployment.md, "When to shard, and how").
//
// The unit is the Kafka partition: the directory row (group, topic, partition) names the one
// shard that holds the partition's whole kafkatx state — watermark, attempts, dead letters,
// done offsets, idempotency keys, outbox rows — and on which its handler's transaction runs.
// A batch still commits in one transaction on one database, so every guarantee of the
// unsharded loop holds per shard. The directory lives in kafkatx's schema (table
// shard_directory, migration 16) of the database the service names as its directory
// (--database-url); a partition with no row is placed on the first shard named, and the row
// is written at that first placement so it stays there.
//
// Sharding is opt-in: a kafkatx.Config without Shards runs on one database as before.
package shards

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// States of a directory row.
const (
	StateActive = "active" // the shard named holds the partition
	StateMoving = "moving" // a move began; the shard named is still authoritative
)

// Shard is one PostgreSQL database holding the state of the partitions mapped to it. Name is
// what the directory stores (non-empty, no '=' or white space); Pool is the shard's own pool,
// whose size is the shard's connection budget in this process.
type Shard struct {
	Name string
	Pool *pgxpool.Pool
}

// Set is a service's shards and the pool of its directory's database. The first shard takes
// every partition the directory does not map yet. Directory may be one of the shards' pools
// (the directory's database may also be a shard). Open builds one from --shard specs.
type Set struct {
	Directory *pgxpool.Pool
	Shards    []Shard

	opened []*pgxpool.Pool // the pools Open opened, which Close closes
}

// Validate checks the set: a directory pool, at least one shard, names non-empty, valid and
// unique, every pool non-nil.
func (s *Set) Validate() error {
	if s.Directory == nil {
		return errors.New("shards: nil Directory pool")
	}
	if len(s.Shards) == 0 {
		return errors.New("shards: a Set needs at least one shard")
	}
	seen := map[string]bool{}
	for i, sh := range s.Shards {
		if err := CheckName(sh.Name); err != nil {
			return fmt.Errorf("shards: shard %d: %w", i+1, err)
		}
		if seen[sh.Name] {
			return fmt.Errorf("shards: shard %q named twice", sh.Name)
		}
		seen[sh.Name] = true
		if sh.Pool == nil {
			return fmt.Errorf("shards: shard %q has a nil pool", sh.Name)
		}
	}
	return nil
}

// Pool returns the pool of the shard named name, or nil.
func (s *Set) Pool(name string) *pgxpool.Pool {
	for _, sh := range s.Shards {
		if sh.Name == name {
			return sh.Pool
		}
	}
	return nil
}

// Names lists the shards' names in order.
func (s *Set) Names() []string {
	out := make([]string, len(s.Shards))
	for i, sh := range s.Shards {
		out[i] = sh.Name
	}
	return out
}

// CheckName refuses a shard name that is empty, longer than 63 bytes, or holds '=', ',' or
// white space (a name appears in --shard NAME=URL and in logs).
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("empty shard name")
	case len(name) > 63:
		return fmt.Errorf("shard name %.20q… longer than 63 bytes", name)
	case strings.ContainsAny(name, "=, \t\r\n"):
		return fmt.Errorf("shard name %q holds '=', ',' or white space", name)
	}
	return nil
}

// Entry is one directory row: partition Partition of Topic, read by consumer group Group, is
// held by shard Shard since epoch Epoch (raised by every reassignment and move).
type Entry struct {
	Group     string    `json:"group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Shard     string    `json:"shard"`
	Epoch     int64     `json:"epoch"`
	State     string    `json:"state"`               // StateActive or StateMoving
	MovingTo  string    `json:"moving_to,omitempty"` // with StateMoving: the target shard
	UpdatedAt time.Time `json:"updated_at"`
}

// Directory reads and writes the shard directory in schema (default kafkatx) of one database.
type Directory struct {
	q pg.Querier
	t tables.Names
}

// NewDirectory returns the directory in schema ("" means pg.DefaultSchema) reached through q.
func NewDirectory(q pg.Querier, schema string) *Directory {
	return &Directory{q: q, t: tables.For(pg.SchemaOr(schema))}
}

const entryCols = `group_id, topic, partition, shard, epoch, state, coalesce(moving_to, ''), updated_at`

func scanEntries(rows pgx.Rows) ([]Entry, error) {
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		if err := rows.Scan(&e.Group, &e.Topic, &e.Partition, &e.Shard, &e.Epoch, &e.State, &e.MovingTo, &e.UpdatedAt); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// List returns the directory's rows of group (every group when group is ""), ordered by
// group, topic and partition.
func (d *Directory) List(ctx context.Context, group string) ([]Entry, error) {
	rows, err := d.q.Query(ctx, `SELECT `+entryCols+` FROM `+d.t.ShardDirectory+`
		WHERE $1 = '' OR group_id = $1 ORDER BY group_id, topic, partition`, group)
	if err != nil {
		return nil, fmt.Errorf("read the shard directory: %w", err)
	}
	out, err := scanEntries(rows)
	if err != nil {
		return nil, fmt.Errorf("read the shard directory: %w", err)
	}
	return out, nil
}

// Place returns the rows of group's partitions of topic, first writing a row on shard first
// (epoch 1, active) for each partition that has none: the placement of an unmapped partition
// is recorded at once, so it stays on that shard when the shards named later change.
func (d *Directory) Place(ctx context.Context, group, topic string, partitions []int32, first string) (map[int32]Entry, error) {
	if _, err := d.q.Exec(ctx, `INSERT INTO `+d.t.ShardDirectory+` (group_id, topic, partition, shard)
		SELECT $1, $2, p, $4 FROM unnest($3::int[]) AS p ON CONFLICT DO NOTHING`, group, topic, partitions, first); err != nil {
		return nil, fmt.Errorf("place partitions of %s on shard %q: %w", topic, first, err)
	}
	rows, err := d.q.Query(ctx, `SELECT `+entryCols+` FROM `+d.t.ShardDirectory+`
		WHERE group_id = $1 AND topic = $2 AND partition = ANY($3::int[])`, group, topic, partitions)
	if err != nil {
		return nil, fmt.Errorf("read the shard directory: %w", err)
	}
	es, err := scanEntries(rows)
	if err != nil {
		return nil, fmt.Errorf("read the shard directory: %w", err)
	}
	out := make(map[int32]Entry, len(es))
	for _, e := range es {
		out[e.Partition] = e
	}
	return out, nil
}

// MappedElsewhereError is Assign's refusal: the partition is already mapped to another shard,
// where its state lives; moving it is Move's work.
type MappedElsewhereError struct {
	Entry Entry
	To    string
}

func (e *MappedElsewhereError) Error() string {
	return fmt.Sprintf("partition %d of topic %q (group %q) is already on shard %q (epoch %d, %s): its state lives there; move it with `kafkatx shards move --to %s`",
		e.Entry.Partition, e.Entry.Topic, e.Entry.Group, e.Entry.Shard, e.Entry.Epoch, e.Entry.State, e.To)
}

// Assign maps a partition that has no row yet to shard to (epoch 1, active) and returns its
// row; assigning a partition to the shard it is on already changes nothing (changed false). A
// partition on another shard is refused with *MappedElsewhereError: its state is there.
func (d *Directory) Assign(ctx context.Context, group, topic string, partition int32, to string) (e Entry, changed bool, err error) {
	if err := CheckName(to); err != nil {
		return e, false, err
	}
	tag, err := d.q.Exec(ctx, `INSERT INTO `+d.t.ShardDirectory+` (group_id, topic, partition, shard)
		VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, group, topic, partition, to)
	if err != nil {
		return e, false, fmt.Errorf("assign partition %d of %s: %w", partition, topic, err)
	}
	m, err := d.Place(ctx, group, topic, []int32{partition}, to)
	if err != nil {
		return e, false, err
	}
	e = m[partition]
	if e.Shard != to {
		return e, false, &MappedElsewhereError{Entry: e, To: to}
	}
	return e, tag.RowsAffected() == 1, nil
}
