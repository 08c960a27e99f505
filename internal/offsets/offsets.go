// Package offsets holds the operator side of "the database leads, Kafka follows"
// (docs/design.md, "Offsets: the database leads, Kafka follows"): per-partition status of the processed watermark against Kafka's committed
// offset, lockstep resets of both sides (skip, replay, align) with an audit row each, and the
// offset accounting report that proves every offset below the watermark was processed,
// dead-lettered or skipped (invariant 2). The kafkatx command is a thin shell around it.
package offsets

import (
	"context"
	"fmt"
	"os"
	"os/user"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Audit row statuses, as offsetstore lists them.
const (
	StatusPending   = offsetstore.StatusPending
	StatusApplied   = offsetstore.StatusApplied
	StatusAbandoned = offsetstore.StatusAbandoned
)

// Operator runs the offset commands of one schema against one database and one cluster.
type Operator struct {
	pool  *pgxpool.Pool
	kafka *Kafka
	store *offsetstore.Store
	t     tables.Names
}

// NewOperator returns an Operator for kafkatx's tables in schema ("" means "kafkatx").
func NewOperator(pool *pgxpool.Pool, k *Kafka, schema string) *Operator {
	schema = pg.SchemaOr(schema)
	s := offsetstore.New(schema)
	return &Operator{pool: pool, kafka: k, store: s, t: s.Tables()}
}

// Pool is the database the operator acts on.
func (o *Operator) Pool() *pgxpool.Pool { return o.pool }

// On returns an operator on pool (a shard's database) sharing o's Kafka client and schema.
func (o *Operator) On(pool *pgxpool.Pool) *Operator {
	c := *o
	c.pool = pool
	return &c
}

// Actor names who runs an operator command: the OS user (and the sudo user behind it) at
// the host name, for example "alice@db-admin-1".
func Actor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if su := os.Getenv("SUDO_USER"); su != "" && su != name {
		name = su + " (as " + name + ")"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}

// topicPartitions lists tps of topic: every partition, or only partition p when p ≥ 0.
func (o *Operator) topicPartitions(ctx context.Context, topic string, p int32) ([]offsetstore.TP, error) {
	ids, err := o.kafka.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []offsetstore.TP
	for _, id := range ids {
		if p < 0 || id == p {
			out = append(out, offsetstore.TP{Topic: topic, Partition: id})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("topic %s has no partition %d (partitions 0..%d)", topic, p, len(ids)-1)
	}
	return out, nil
}

// Group returns the broker's view of the consumer group (state and active members).
func (o *Operator) Group(ctx context.Context, group string) (Group, error) {
	return o.kafka.DescribeGroup(ctx, group)
}

// Events returns the offset audit trail of group, oldest first (topic "" means every topic).
func (o *Operator) Events(ctx context.Context, group, topic string) ([]offsetstore.Event, error) {
	return o.store.Events(ctx, o.pool, group, topic)
}
