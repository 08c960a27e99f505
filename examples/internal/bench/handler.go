package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/outbox"
)

// The bench runs the order service's own writes (package examples/orders/order): the order
// row, the customer counter aggregated and sorted by customer, and one outbox event per
// applied order.

// handler is the order service's batch handler, with the latency probe told which
// messages each transaction holds.
func handler(svc *order.Service, probe *commitProbe) kafkatx.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
		if probe != nil {
			probe.holding(tx.Conn(), msgs)
		}
		return svc.HandleBatch(ctx, tx, msgs)
	}
}

// plainEvents writes the events to a plain (topic, key, value) table instead of kafkatx's
// outbox: the ceiling's way to price kafkatx's outbox table.
func plainEvents(table string) func(ctx context.Context, tx pgx.Tx, events ...outbox.Record) ([]int64, error) {
	return func(ctx context.Context, tx pgx.Tx, events ...outbox.Record) ([]int64, error) {
		topics, keys, values := make([]string, len(events)), make([][]byte, len(events)), make([][]byte, len(events))
		for i, e := range events {
			topics[i], keys[i], values[i] = e.Topic, e.Key, e.Value
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (topic, key, value) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])`, topics, keys, values)
		return nil, err
	}
}

var (
	customers = []string{"c-001", "c-002", "c-003", "c-004", "c-005", "c-006", "c-007", "c-008", "c-009", "c-010"}
	items     = []string{"widget", "gadget", "doohickey", "thingamajig"}
)

// orderValue is message i of run as examples/orders --generate writes it: ten customers, four
// items, ids unique across runs.
func orderValue(run string, i int) (key, value []byte) {
	id := fmt.Sprintf("GEN-%s-%d", run, i)
	v := fmt.Sprintf(`{"order_id":%q,"customer":%q,"item":%q,"quantity":%d,"price":%d.%02d}`,
		id, customers[i%len(customers)], items[i%len(items)], 1+i%5, 1+i%40, (i*7)%100)
	return []byte(id), []byte(v)
}
