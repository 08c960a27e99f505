package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// SchemaSQL creates the service's tables in the database's default schema.
const SchemaSQL = `
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
);
-- The Kafka partition an order came from: what a shard move takes with the partition
-- (MovePartition). Orders applied before these columns existed have NULL and stay.
ALTER TABLE order_totals ADD COLUMN IF NOT EXISTS kafka_topic text, ADD COLUMN IF NOT EXISTS kafka_partition integer;
CREATE INDEX IF NOT EXISTS order_totals_partition_idx ON order_totals (kafka_topic, kafka_partition);`

// Migrate creates the service's tables, serialized across processes by an advisory lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	// The lock is session-level: refuse a transaction pooler (pg.RequireSession).
	if err := pg.RequireSession(ctx, conn.Conn()); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// Serialize concurrent starts: CREATE TABLE IF NOT EXISTS races on the catalog.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('kafkatx.example.orders'))"); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext('kafkatx.example.orders'))") //nolint:errcheck
	if _, err := conn.Exec(ctx, SchemaSQL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// DefaultBatchSize is examples/orders' --batch-size default: orders per transaction. The
// library's default is 500; a bulk order service takes more: with the relay in-process, 5,000
// orders per transaction drained a 300,000-order backlog at about 66k/s against 50k/s at
// 1,000 (three runs each, 2 cores). The cost: after a crash, the offsets that were in flight
// (the running batch and at most one more) are suspect and run in pieces of a sixteenth
// (docs/design.md, "Crash isolation in pieces").
const DefaultBatchSize = 5000

// Service applies orders.
type Service struct {
	// EventsTopic receives one event per applied order; empty: no events.
	EventsTopic string
	// WriteEvents writes the events in the batch's transaction. Defaults to
	// outbox.Writer{}.WriteTx (schema kafkatx).
	WriteEvents func(ctx context.Context, tx pgx.Tx, events ...outbox.Record) ([]int64, error)
	// CrashPill, when set, is called for a message carrying the header CrashPillHeader before
	// anything of its batch is applied (the command exits the process in it: orders
	// --crash-every); nil applies such a message as any other order.
	CrashPill func(m *kafkatx.Message)
	// Annotate, when set, is called for each event with the order's message before the event
	// is written: the command sets it to carry the message's trace context in the event's
	// headers (kafkatxotel.Tracer.InjectOutbox with m.Context()).
	Annotate func(m *kafkatx.Message, event *outbox.Record)
}

// CrashPillHeader marks a crash pill (orders --generate N --crash-every K): a valid-looking
// order whose handling makes the process exit (Service.CrashPill), every time it is handled.
const CrashPillHeader = "orders-crash-pill"

// Applied is the event published to --events-topic for each applied order.
type Applied struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// HandleBatch applies a batch of orders with three statements whatever its size: the order
// rows in one multi-row INSERT (an order id seen before is skipped), then the customers'
// counters aggregated and sorted by customer, so partitions running in parallel lock hot
// customer rows in the same order and do not deadlock. An invalid order fails alone.
func (s *Service) HandleBatch(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
	n := len(msgs)
	ids, customers, items := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	qty, totals := make([]int64, 0, n), make([]int64, 0, n)
	first := make(map[string]int, n) // order id -> index of its first message: the one inserted
	for _, m := range msgs {
		if _, pill := m.Header(CrashPillHeader); pill && s.CrashPill != nil {
			s.CrashPill(m)
		}
		o, err := Parse(m.Value)
		if err != nil {
			return kafkatx.FailMessage(m, kafkatx.Permanent(err))
		}
		if _, seen := first[o.OrderID]; !seen {
			first[o.OrderID] = len(ids)
		}
		ids, customers, items = append(ids, o.OrderID), append(customers, o.Customer), append(items, o.Item)
		qty, totals = append(qty, o.Quantity), append(totals, o.TotalCents)
	}
	// In message order, so that of two messages with one order id the first is inserted: the
	// events and counters below take the customer and total of the first.
	// A batch is one partition's (kafkatx runs a partition's messages in its own transactions).
	rows, err := tx.Query(ctx, `INSERT INTO order_totals (order_id, customer, item, quantity, total_cents, kafka_topic, kafka_partition)
		SELECT r.id, r.customer, r.item, r.qty, r.total, $6, $7
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS r(id, customer, item, qty, total, ord)
		 ORDER BY r.ord
		ON CONFLICT (order_id) DO NOTHING RETURNING order_id`, ids, customers, items, qty, totals, msgs[0].Topic, msgs[0].Partition)
	if err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	type sum struct{ orders, cents int64 }
	byCustomer := map[string]*sum{}
	events := make([]outbox.Record, 0, n)
	for rows.Next() {
		// The returned order id's bytes (text: the same in either wire format), looked up
		// without a copy; the id is the batch's own string. A Scan would allocate each row.
		raw := rows.RawValues()
		i, ok := 0, false
		if len(raw) == 1 {
			i, ok = first[string(raw[0])]
		}
		if !ok {
			rows.Close()
			return fmt.Errorf("insert orders: RETURNING gave %q, not an order id of the batch", raw)
		}
		id, c, cents := ids[i], customers[i], totals[i]
		if s.EventsTopic != "" {
			ev, _ := json.Marshal(Applied{OrderID: id, Customer: c, TotalCents: cents})
			// Source: the event's id is derived from its order's message, so an order
			// processed again (after a database failover) publishes the same id.
			events = append(events, outbox.Record{Topic: s.EventsTopic, Key: []byte(id), Value: ev, Source: msgs[i].OutboxSource()})
			if s.Annotate != nil {
				s.Annotate(msgs[i], &events[len(events)-1])
			}
		}
		if byCustomer[c] == nil {
			byCustomer[c] = &sum{}
		}
		sum := byCustomer[c]
		if sum.cents > math.MaxInt64-cents {
			rows.Close()
			return kafkatx.FailMessage(msgs[i], kafkatx.Permanent(fmt.Errorf("customer %s: total would pass the bigint range", c)))
		}
		sum.orders++
		sum.cents += cents
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	if len(byCustomer) == 0 {
		return nil
	}
	// One event per applied order, published by the relay if and only if this commits.
	write := s.WriteEvents
	if write == nil {
		write = outbox.Writer{}.WriteTx
	}
	if _, err := write(ctx, tx, events...); err != nil {
		return fmt.Errorf("write order events: %w", err)
	}
	names := make([]string, 0, len(byCustomer))
	for c := range byCustomer {
		names = append(names, c)
	}
	sort.Strings(names)
	counts, cents := make([]int64, len(names)), make([]int64, len(names))
	for i, c := range names {
		counts[i], cents[i] = byCustomer[c].orders, byCustomer[c].cents
	}
	_, err = tx.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total_cents)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
		ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + excluded.orders,
			total_cents = customer_totals.total_cents + excluded.total_cents`, names, counts, cents)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22003" && len(msgs) == 1 {
			// numeric_value_out_of_range: this order takes its customer's running total past
			// bigint. No retry can change that. (In a larger batch the error does not say which
			// order; kafkatx then runs the batch one message per transaction.)
			return kafkatx.Permanent(fmt.Errorf("add to customer: %w", err))
		}
		return fmt.Errorf("add to customers: %w", err)
	}
	return nil
}
