package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
)

const schemaSQL = `
CREATE TABLE IF NOT EXISTS order_totals (
    order_id    text PRIMARY KEY,
    customer    text   NOT NULL,
    item        text   NOT NULL,
    quantity    bigint NOT NULL,
    total_cents bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS customer_totals (
    customer    text PRIMARY KEY,
    orders      bigint NOT NULL,
    total_cents bigint NOT NULL
);`

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	// Serialize concurrent starts: CREATE TABLE IF NOT EXISTS races on the catalog.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('kafkatx.example.orders'))"); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext('kafkatx.example.orders'))") //nolint:errcheck
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

type service struct {
	eventsTopic string
}

// handle applies one order: the order row, once per order id, and the customer's running
// counter, which shows any duplicate effect. An invalid order is a permanent error.
func (s *service) handle(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	o, err := parseOrder(m.Value)
	if err != nil {
		return kafkatx.Permanent(err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO order_totals (order_id, customer, item, quantity, total_cents)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (order_id) DO NOTHING`, o.OrderID, o.Customer, o.Item, o.Quantity, o.TotalCents)
	if err != nil {
		return fmt.Errorf("insert order %s: %w", o.OrderID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil // the same order id seen before at another offset: applied once
	}
	_, err = tx.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total_cents) VALUES ($1, 1, $2)
		ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1, total_cents = customer_totals.total_cents + excluded.total_cents`,
		o.Customer, o.TotalCents)
	if err != nil {
		return fmt.Errorf("add to customer %s: %w", o.Customer, err)
	}
	return nil
}
