// Package order is the example order service's domain: strict parsing of an order message
// and the batch handler that applies orders (the order row, the customer's running counter,
// one outbox event per applied order). examples/orders runs it; internal/bench measures it.
package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Order is one order message. price is a JSON decimal; it is converted to integer cents
// without floating point.
type Order struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	Item       string `json:"item"`
	Quantity   int64  `json:"quantity"`
	TotalCents int64  `json:"-"`
}

// priceRe accepts up to 999,999,999.99: with at most 1,000,000 items an order's total stays
// far below the int64 limit of the cents columns.
var priceRe = regexp.MustCompile(`^(0|[1-9][0-9]{0,8})(\.([0-9]+))?$`)

// maxTextBytes bounds order_id, customer and item.
const maxTextBytes = 200

// Parse parses one order strictly: a JSON object with a non-empty order_id and
// customer, an item, a positive integer quantity and a non-negative decimal price with at
// most two significant decimals.
func Parse(value []byte) (Order, error) {
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
		return Order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	if dec.More() {
		return Order{}, errors.New("not a JSON order: trailing data")
	}
	switch {
	case raw.OrderID == nil || strings.TrimSpace(*raw.OrderID) == "":
		return Order{}, errors.New("order_id missing")
	case raw.Customer == nil || *raw.Customer == "":
		return Order{}, errors.New("customer missing")
	case raw.Item == nil:
		return Order{}, errors.New("item missing")
	case raw.Quantity == nil:
		return Order{}, errors.New("quantity missing")
	case raw.Price == nil:
		return Order{}, errors.New("price missing")
	}
	for name, v := range map[string]string{"order_id": *raw.OrderID, "customer": *raw.Customer, "item": *raw.Item} {
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) || len(v) > maxTextBytes {
			return Order{}, fmt.Errorf("%s is not valid UTF-8 text without NUL of at most %d bytes", name, maxTextBytes)
		}
	}
	qty, err := strconv.ParseInt(raw.Quantity.String(), 10, 64)
	if err != nil || qty <= 0 || qty > 1_000_000 {
		return Order{}, fmt.Errorf("quantity %q is not a positive integer up to 1000000", raw.Quantity.String())
	}
	cents, err := priceCents(raw.Price.String())
	if err != nil {
		return Order{}, err
	}
	return Order{OrderID: *raw.OrderID, Customer: *raw.Customer, Item: *raw.Item, Quantity: qty, TotalCents: qty * cents}, nil
}

// priceCents converts a decimal such as "24.50" to 2450 exactly.
func priceCents(s string) (int64, error) {
	m := priceRe.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("price %q is not a decimal from 0 to 999999999.99", s)
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
