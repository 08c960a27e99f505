// Package order is the example order service's domain: strict parsing of an order message
// and the batch handler that applies orders (the order row, the customer's running counter,
// one outbox event per applied order). examples/orders runs it; internal/bench measures it.
package order

import (
	"encoding/json"
	"errors"
	"fmt"
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

// maxPriceWhole bounds a price's whole part: with at most 1,000,000 items an order's total
// (at most 999,999,999.99 each) stays far below the int64 limit of the cents columns.
const maxPriceWhole = 999_999_999

// maxTextBytes bounds order_id, customer and item.
const maxTextBytes = 200

// Parse parses one order strictly: a JSON object with a non-empty order_id and
// customer, an item, a positive integer quantity and a non-negative decimal price with at
// most two significant decimals. One pass of encoding/json and no regular expression: the
// handler calls it once per message on the hot path (about 1 µs, see BenchmarkParse).
func Parse(value []byte) (Order, error) {
	var raw struct {
		OrderID  string      `json:"order_id"`
		Customer string      `json:"customer"`
		Item     *string     `json:"item"` // "" is an item; absent is not
		Quantity json.Number `json:"quantity"`
		Price    json.Number `json:"price"`
	}
	// Unmarshal refuses trailing data after the object.
	if err := json.Unmarshal(value, &raw); err != nil {
		return Order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	switch {
	case strings.TrimSpace(raw.OrderID) == "":
		return Order{}, errors.New("order_id missing")
	case raw.Customer == "":
		return Order{}, errors.New("customer missing")
	case raw.Item == nil:
		return Order{}, errors.New("item missing")
	case raw.Quantity == "":
		return Order{}, errors.New("quantity missing")
	case raw.Price == "":
		return Order{}, errors.New("price missing")
	}
	if err := checkText("order_id", raw.OrderID); err != nil {
		return Order{}, err
	}
	if err := checkText("customer", raw.Customer); err != nil {
		return Order{}, err
	}
	if err := checkText("item", *raw.Item); err != nil {
		return Order{}, err
	}
	qty, err := strconv.ParseInt(raw.Quantity.String(), 10, 64)
	if err != nil || qty <= 0 || qty > 1_000_000 {
		return Order{}, fmt.Errorf("quantity %q is not a positive integer up to 1000000", raw.Quantity.String())
	}
	cents, err := priceCents(raw.Price.String())
	if err != nil {
		return Order{}, err
	}
	return Order{OrderID: raw.OrderID, Customer: raw.Customer, Item: *raw.Item, Quantity: qty, TotalCents: qty * cents}, nil
}

// checkText refuses invalid UTF-8, NUL (PostgreSQL text cannot hold it) and more than
// maxTextBytes bytes.
func checkText(name, v string) error {
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 || len(v) > maxTextBytes {
		return fmt.Errorf("%s is not valid UTF-8 text without NUL of at most %d bytes", name, maxTextBytes)
	}
	return nil
}

// priceCents converts a decimal such as "24.50" to 2450 exactly: a whole part without
// leading zeros up to maxPriceWhole, then optionally "." and digits of which at most two are
// significant (trailing zeros are).
func priceCents(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("price %q is not a decimal from 0 to %d.99", s, maxPriceWhole)
	}
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || len(whole) > 9 || (len(whole) > 1 && whole[0] == '0') || !digits(whole) || (dot && (frac == "" || !digits(frac))) {
		return bad()
	}
	w, _ := strconv.ParseInt(whole, 10, 64) // at most 9 digits: cannot fail
	frac = strings.TrimRight(frac, "0")
	if len(frac) > 2 {
		return 0, fmt.Errorf("price %q has more than two decimals", s)
	}
	var f int64
	for i := 0; i < 2; i++ {
		f *= 10
		if i < len(frac) {
			f += int64(frac[i] - '0')
		}
	}
	return w*100 + f, nil
}

// digits reports whether s is made of ASCII digits only.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
