// Package catchup asks the broker and the database whether a consumer group has caught up
// on a topic: every partition's watermark in PostgreSQL (kafkatx's tables) at or past its
// log end. The example binaries' --exit-when-idle uses it; a service may use it for the same
// "drained" test.
package catchup

import (
	"context"
	"fmt"
	"sort"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/pg"
)

// Checker compares each partition's watermark with its log end (ListOffsets, read_committed:
// the last stable offset). Safe for concurrent use; Close releases its Kafka admin client.
type Checker struct {
	kafka *offsets.Kafka
	store *offsetstore.Store
}

// New connects an admin client with kafkaCfg (bootstrap.servers and any security
// settings; never logged) for kafkatx's tables in schema ("" means pg.DefaultSchema).
func New(kafkaCfg kafka.ConfigMap, log *zap.Logger, schema string) (*Checker, error) {
	if log == nil {
		log = zap.NewNop()
	}
	k, err := offsets.NewKafka(kafkaCfg, log)
	if err != nil {
		return nil, err
	}
	return &Checker{kafka: k, store: offsetstore.New(pg.SchemaOr(schema))}, nil
}

// Close releases the admin client.
func (c *Checker) Close() { c.kafka.Close() }

// Behind returns the partitions of topic whose log end is ahead of group's watermark, in
// partition order, as "topic[p] watermark W, log end E" (or "topic[p] no watermark, log S..E"
// for a partition with records and no watermark row; one with an empty log is caught up).
// Empty means caught up. An error says what could not be asked (the broker, the database).
func (c *Checker) Behind(ctx context.Context, q pg.Querier, group, topic string) ([]string, error) {
	return c.BehindOn(ctx, []pg.Querier{q}, group, topic)
}

// BehindOn is Behind for a sharded group: each partition's watermark is read on every database
// of qs (the shards) and the highest counts (a partition moved to another shard continues
// there from where it left the old one).
func (c *Checker) BehindOn(ctx context.Context, qs []pg.Querier, group, topic string) ([]string, error) {
	ps, err := c.kafka.Partitions(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("cannot ask the broker for the topic's partitions: %w", err)
	}
	tps := make([]offsetstore.TP, len(ps))
	for i, p := range ps {
		tps[i] = offsetstore.TP{Topic: topic, Partition: p}
	}
	ranges, err := c.kafka.LogOffsets(ctx, tps)
	if err != nil {
		return nil, fmt.Errorf("cannot ask the broker for the log ends: %w", err)
	}
	wms := map[offsetstore.TP]offsetstore.Watermark{}
	for _, q := range qs {
		ws, err := c.store.Watermarks(ctx, q, group, tps)
		if err != nil {
			return nil, fmt.Errorf("cannot read the watermarks: %w", err)
		}
		for tp, w := range ws {
			if old, ok := wms[tp]; !ok || w.Next > old.Next {
				wms[tp] = w
			}
		}
	}
	return behindLogEnd(ranges, wms), nil
}

// behindLogEnd lists the partitions of ranges whose log end is ahead of their watermark in
// wms, in partition order.
func behindLogEnd(ranges map[offsetstore.TP]offsets.LogRange, wms map[offsetstore.TP]offsetstore.Watermark) []string {
	var tps []offsetstore.TP
	for tp := range ranges {
		tps = append(tps, tp)
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].Topic != tps[j].Topic {
			return tps[i].Topic < tps[j].Topic
		}
		return tps[i].Partition < tps[j].Partition
	})
	var out []string
	for _, tp := range tps {
		r := ranges[tp]
		w, ok := wms[tp]
		switch {
		case !ok && r.End > r.Start:
			out = append(out, fmt.Sprintf("%s no watermark, log %d..%d", tp, r.Start, r.End))
		case ok && w.Next < r.End:
			out = append(out, fmt.Sprintf("%s watermark %d, log end %d", tp, w.Next, r.End))
		}
	}
	return out
}
