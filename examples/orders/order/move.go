package order

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MovePartition is the service's shards.MoveHook: it moves the orders of one Kafka partition
// (order_totals rows by kafka_topic, kafka_partition) from the shard the partition leaves to
// the target, and moves their share of customer_totals with them (subtracted there, added
// here). On the target it first takes out what an earlier, interrupted run of the same move
// wrote, so running it again counts nothing twice. Orders applied before the partition
// columns existed (NULL) cannot be attributed and stay where they are.
func MovePartition(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error {
	if err := takeOut(ctx, to, topic, partition, nil); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	var moved [][]any
	if err := takeOut(ctx, from, topic, partition, &moved); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if len(moved) == 0 {
		return nil
	}
	if _, err := to.CopyFrom(ctx, pgx.Identifier{"order_totals"},
		[]string{"order_id", "customer", "item", "quantity", "total_cents", "kafka_topic", "kafka_partition"}, pgx.CopyFromRows(moved)); err != nil {
		return fmt.Errorf("target: write orders: %w", err)
	}
	_, err := to.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total_cents)
		SELECT customer, count(*), sum(total_cents) FROM order_totals WHERE kafka_topic = $1 AND kafka_partition = $2
		 GROUP BY customer ORDER BY customer
		ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + excluded.orders,
			total_cents = customer_totals.total_cents + excluded.total_cents`, topic, partition)
	if err != nil {
		return fmt.Errorf("target: add to customers: %w", err)
	}
	return nil
}

// UndoMove is the service's shards.CancelHook: it takes out, on the target of a cancelled
// move, the orders of the partition MovePartition copied there and their share of
// customer_totals (idempotent: nothing to take out, nothing done).
func UndoMove(ctx context.Context, to pgx.Tx, group, topic string, partition int32) error {
	if err := takeOut(ctx, to, topic, partition, nil); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	return nil
}

// takeOut deletes the partition's orders in tx and subtracts them from their customers'
// totals; with rows, it returns the deleted orders.
func takeOut(ctx context.Context, tx pgx.Tx, topic string, partition int32, rows *[][]any) error {
	if _, err := tx.Exec(ctx, `UPDATE customer_totals c SET orders = c.orders - d.n, total_cents = c.total_cents - d.s
		  FROM (SELECT customer, count(*) AS n, sum(total_cents) AS s FROM order_totals
		         WHERE kafka_topic = $1 AND kafka_partition = $2 GROUP BY customer) d
		 WHERE c.customer = d.customer`, topic, partition); err != nil {
		return fmt.Errorf("subtract from customers: %w", err)
	}
	rs, err := tx.Query(ctx, `DELETE FROM order_totals WHERE kafka_topic = $1 AND kafka_partition = $2
		RETURNING order_id, customer, item, quantity, total_cents, kafka_topic, kafka_partition`, topic, partition)
	if err != nil {
		return fmt.Errorf("delete orders: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		if rows == nil {
			continue
		}
		vs, err := rs.Values()
		if err != nil {
			return err
		}
		*rows = append(*rows, vs)
	}
	return rs.Err()
}
