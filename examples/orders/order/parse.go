// Package order is the example order service's domain: strict parsing of an order message
// and the batch handler that applies orders (the order row, the customer's running counter,
// one outbox event per applied order). examples/orders runs it; internal/bench measures it.
package order

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"
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

// parsers are reused across calls: Parse runs once per message on the hot path.
var parsers fastjson.ParserPool

// Parse parses one order strictly: a JSON object with a non-empty order_id and
// customer, an item, a positive integer quantity and a non-negative decimal price with at
// most two significant decimals. Strings must be valid UTF-8 and their escapes valid UTF-16
// (no replacement character is substituted), each field may appear once (names match
// case-insensitively, as with encoding/json), and nothing may follow the object. An order of
// the common shape (the five fields in lower case, texts without escapes) is read in one pass
// without a tree (parseCommon); any other input goes through valyala/fastjson, a validator
// and parser without reflection (BenchmarkParse measures both).
func Parse(value []byte) (Order, error) {
	if o, ok := parseCommon(value); ok {
		return o, nil
	}
	return parseFull(value)
}

// parseFull is Parse without its fast path: fastjson's strict validation, then its parse.
func parseFull(value []byte) (Order, error) {
	// Parse is lenient with some malformed input (an unknown escape such as \x is kept);
	// ValidateBytes is strict RFC 8259 (escapes, numbers, control characters, trailing data).
	if err := fastjson.ValidateBytes(value); err != nil {
		return Order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	// fastjson keeps a lone UTF-16 surrogate escape (\ud800) as text, and can drop the escape
	// after it; encoding/json would substitute U+FFFD. Neither is the sender's text: refuse.
	if loneSurrogate(value) {
		return Order{}, errors.New(`not a JSON order: a \u escape is a lone UTF-16 surrogate`)
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(value)
	if err != nil {
		return Order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	obj, err := v.Object()
	if err != nil {
		return Order{}, fmt.Errorf("not a JSON order: %w", err)
	}
	var f [5]*fastjson.Value // order_id, customer, item, quantity, price
	var dup string
	obj.Visit(func(k []byte, v *fastjson.Value) {
		// Field names match case-insensitively, as with encoding/json.
		i := slices.IndexFunc(fieldNames[:], func(name string) bool { return bytes.EqualFold(k, []byte(name)) })
		if i < 0 {
			return // other fields are ignored
		}
		if f[i] != nil && dup == "" {
			dup = fieldNames[i]
		}
		f[i] = v
	})
	if dup != "" {
		return Order{}, fmt.Errorf("not a JSON order: field %s appears twice", dup)
	}
	var text [3]string
	for i := range text {
		if f[i] == nil || f[i].Type() == fastjson.TypeNull {
			continue
		}
		b, err := f[i].StringBytes()
		if err != nil {
			return Order{}, fmt.Errorf("not a JSON order: %s: %w", fieldNames[i], err)
		}
		text[i] = string(b) // copies out of the parser's buffer
	}
	switch {
	case strings.TrimSpace(text[0]) == "":
		return Order{}, errors.New("order_id missing")
	case text[1] == "":
		return Order{}, errors.New("customer missing")
	case f[2] == nil || f[2].Type() == fastjson.TypeNull:
		return Order{}, errors.New("item missing")
	}
	for i, name := range fieldNames[:3] {
		if err := checkText(name, text[i]); err != nil {
			return Order{}, err
		}
	}
	var nums [2]string
	for i := range nums {
		fv := f[3+i]
		switch {
		case fv == nil || fv.Type() == fastjson.TypeNull:
			return Order{}, fmt.Errorf("%s missing", fieldNames[3+i])
		case fv.Type() != fastjson.TypeNumber:
			return Order{}, fmt.Errorf("not a JSON order: %s is a %s, not a number", fieldNames[3+i], fv.Type())
		}
		nums[i] = fv.String() // the number as written
	}
	qty, err := strconv.ParseInt(nums[0], 10, 64)
	if err != nil || qty <= 0 || qty > 1_000_000 {
		return Order{}, fmt.Errorf("quantity %q is not a positive integer up to 1000000", nums[0])
	}
	cents, err := priceCents(nums[1])
	if err != nil {
		return Order{}, err
	}
	return Order{OrderID: text[0], Customer: text[1], Item: text[2], Quantity: qty, TotalCents: qty * cents}, nil
}

// loneSurrogate reports whether a \u escape in value (already validated JSON) is a UTF-16
// surrogate that is not part of a high-low pair.
func loneSurrogate(value []byte) bool {
	hex4 := func(b []byte) rune {
		r, _ := strconv.ParseUint(string(b), 16, 16) // validated: four hex digits
		return rune(r)
	}
	for i := 0; i < len(value); i++ {
		if value[i] != '\\' {
			continue
		}
		if value[i+1] != 'u' { // validated JSON: an escape is never the last byte
			i++
			continue
		}
		r := hex4(value[i+2 : i+6])
		i += 5
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(value) || value[i+1] != '\\' || value[i+2] != 'u' {
				return true
			}
			if lo := hex4(value[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

// fieldNames are the order's fields, in the order Parse keeps them.
var fieldNames = [5]string{"order_id", "customer", "item", "quantity", "price"}

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
