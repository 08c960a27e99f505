package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
)

// This file is a copy of examples/orders' tables, order parsing and handleBatch (service.go,
// order.go), so that every phase runs the order service's writes: the order row, the customer
// counter aggregated and sorted by customer, and one outbox event per applied order. Only
// recordCommit (the latency probe) is added. Keep it in step with the example.

const ordersSQL = `
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

type service struct {
	eventsTopic string
	outbox      outbox.Writer
	// probe, when not nil, learns which messages the transaction holds, so it can time
	// them when the COMMIT returns.
	probe *commitProbe
	// plainOutbox, when set, names a plain (topic, key, value) table that receives the events
	// instead of kafkatx's outbox: the ceiling's way to price kafkatx's outbox table.
	plainOutbox string
}

type orderApplied struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// handleBatch is examples/orders' handleBatch: three statements whatever the batch size.
func (s *service) handleBatch(ctx context.Context, tx pgx.Tx, msgs []*kafkatx.Message) error {
	if s.probe != nil {
		s.probe.holding(tx.Conn(), msgs)
	}
	n := len(msgs)
	ids, customers, items := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	qty, totals := make([]int64, 0, n), make([]int64, 0, n)
	for _, m := range msgs {
		o, err := parseOrder(m.Value)
		if err != nil {
			return kafkatx.FailMessage(m, kafkatx.Permanent(err))
		}
		ids, customers, items = append(ids, o.OrderID), append(customers, o.Customer), append(items, o.Item)
		qty, totals = append(qty, o.Quantity), append(totals, o.TotalCents)
	}
	rows, err := tx.Query(ctx, `INSERT INTO order_totals (order_id, customer, item, quantity, total_cents)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])
		ON CONFLICT (order_id) DO NOTHING RETURNING order_id, customer, total_cents`, ids, customers, items, qty, totals)
	if err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	type sum struct{ orders, cents int64 }
	byCustomer := map[string]*sum{}
	var events []outbox.Record
	for rows.Next() {
		var id, c string
		var cents int64
		if err := rows.Scan(&id, &c, &cents); err != nil {
			rows.Close()
			return fmt.Errorf("insert orders: %w", err)
		}
		ev, _ := json.Marshal(orderApplied{OrderID: id, Customer: c, TotalCents: cents})
		events = append(events, outbox.Record{Topic: s.eventsTopic, Key: []byte(id), Value: ev})
		if byCustomer[c] == nil {
			byCustomer[c] = &sum{}
		}
		byCustomer[c].orders++
		byCustomer[c].cents += cents
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	if len(byCustomer) == 0 {
		return nil
	}
	if err := s.writeEvents(ctx, tx, events); err != nil {
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
		return fmt.Errorf("add to customers: %w", err)
	}
	return nil
}

func (s *service) writeEvents(ctx context.Context, tx pgx.Tx, events []outbox.Record) error {
	if s.plainOutbox == "" {
		_, err := s.outbox.Write(ctx, tx, events...)
		return err
	}
	topics, keys, values := make([]string, len(events)), make([][]byte, len(events)), make([][]byte, len(events))
	for i, e := range events {
		topics[i], keys[i], values[i] = e.Topic, e.Key, e.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.plainOutbox+` (topic, key, value) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])`, topics, keys, values)
	return err
}

type order struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	Item       string `json:"item"`
	Quantity   int64  `json:"quantity"`
	TotalCents int64  `json:"-"`
}

var priceRe = regexp.MustCompile(`^(0|[1-9][0-9]{0,11})(\.([0-9]+))?$`)

// parseOrder is examples/orders' strict order parser.
func parseOrder(value []byte) (order, error) {
	var raw struct {
		OrderID  *string      `json:"order_id"`
		Customer *string      `json:"customer"`
		Item     *string      `json:"item"`
		Quantity *json.Number `json:"quantity"`
		Price    *json.Number `json:"price"`
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	if dec.More() {
		return order{}, errors.New("not a JSON order: trailing data")
	}
	switch {
	case raw.OrderID == nil || strings.TrimSpace(*raw.OrderID) == "":
		return order{}, errors.New("order_id missing")
	case raw.Customer == nil || *raw.Customer == "":
		return order{}, errors.New("customer missing")
	case raw.Item == nil:
		return order{}, errors.New("item missing")
	case raw.Quantity == nil:
		return order{}, errors.New("quantity missing")
	case raw.Price == nil:
		return order{}, errors.New("price missing")
	}
	qty, err := strconv.ParseInt(raw.Quantity.String(), 10, 64)
	if err != nil || qty <= 0 || qty > 1_000_000 {
		return order{}, fmt.Errorf("quantity %q is not a positive integer up to 1000000", raw.Quantity.String())
	}
	cents, err := priceCents(raw.Price.String())
	if err != nil {
		return order{}, err
	}
	return order{OrderID: *raw.OrderID, Customer: *raw.Customer, Item: *raw.Item, Quantity: qty, TotalCents: qty * cents}, nil
}

func priceCents(s string) (int64, error) {
	m := priceRe.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("price %q is not a non-negative decimal", s)
	}
	whole, _ := strconv.ParseInt(m[1], 10, 64)
	frac := strings.TrimRight(m[3], "0")
	if len(frac) > 2 {
		return 0, fmt.Errorf("price %q has more than two decimals", s)
	}
	frac += strings.Repeat("0", 2-len(frac))
	f, _ := strconv.ParseInt(frac, 10, 64)
	return whole*100 + f, nil
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
