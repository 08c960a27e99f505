package order

import (
	"strconv"
	"strings"
)

// parseCommon is Parse's fast path for the common shape of an order: one JSON object whose
// members are exactly the five fields, each once, spelled in lower case, the three texts
// strings without escapes or control characters, the two numbers plain JSON numbers. It
// reads value once, without building a tree, and copies it into one string that the order's
// three texts share (one allocation an order). ok is false for anything else — another
// field, an escape, a nested value, a duplicate, a null, any value Parse refuses — and Parse
// then runs its full strict parse, which also words the error: so an order parseCommon
// accepts is one Parse's full path accepts with the same result (TestParseCommonAgrees).
func parseCommon(value []byte) (o Order, ok bool) {
	var span [5][2]int // each field's value: [start, end) in value
	var seen [5]bool
	i := skipSpace(value, 0)
	if i >= len(value) || value[i] != '{' {
		return Order{}, false
	}
	i++
	for n := 0; ; n++ {
		i = skipSpace(value, i)
		if n > 0 {
			if i >= len(value) {
				return Order{}, false
			}
			if value[i] == '}' {
				i++
				break
			}
			if value[i] != ',' {
				return Order{}, false
			}
			i = skipSpace(value, i+1)
		}
		// The member's name: one of the five, exactly.
		k0, k1, next, good := plainString(value, i)
		if !good {
			return Order{}, false
		}
		f := fieldIndex(value[k0:k1])
		if f < 0 || seen[f] {
			return Order{}, false
		}
		seen[f] = true
		i = skipSpace(value, next)
		if i >= len(value) || value[i] != ':' {
			return Order{}, false
		}
		i = skipSpace(value, i+1)
		if f < 3 {
			if span[f][0], span[f][1], i, good = plainString(value, i); !good {
				return Order{}, false
			}
			continue
		}
		span[f][0] = i
		if i, good = number(value, i); !good {
			return Order{}, false
		}
		span[f][1] = i
	}
	if skipSpace(value, i) != len(value) || seen != [5]bool{true, true, true, true, true} {
		return Order{}, false
	}
	s := string(value) // the one copy: the texts are substrings of it
	text := func(f int) string { return s[span[f][0]:span[f][1]] }
	o = Order{OrderID: text(0), Customer: text(1), Item: text(2)}
	if strings.TrimSpace(o.OrderID) == "" || o.Customer == "" {
		return Order{}, false
	}
	for f, v := range [3]string{o.OrderID, o.Customer, o.Item} {
		if checkText(fieldNames[f], v) != nil {
			return Order{}, false
		}
	}
	qty, err := strconv.ParseInt(text(3), 10, 64)
	if err != nil || qty <= 0 || qty > 1_000_000 {
		return Order{}, false
	}
	cents, err := priceCents(text(4))
	if err != nil {
		return Order{}, false
	}
	o.Quantity, o.TotalCents = qty, qty*cents
	return o, true
}

// fieldIndex is the index in fieldNames of name spelled exactly, else -1.
func fieldIndex(name []byte) int {
	for i, f := range fieldNames {
		if string(name) == f {
			return i
		}
	}
	return -1
}

// skipSpace returns the index of the first byte at or after i that is not JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string starting at b[i] that has no escape and no control
// character: its contents are b[start:end], next is the index after its closing quote.
func plainString(b []byte, i int) (start, end, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, 0, false
	}
	start = i + 1
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return start, j, j + 1, true
		case c == '\\' || c < 0x20:
			return 0, 0, 0, false
		}
	}
	return 0, 0, 0, false
}

// number reads a JSON number (RFC 8259) starting at b[i] and returns the index after it.
func number(b []byte, i int) (int, bool) {
	digitsFrom := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return 0, false
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = digitsFrom(i)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digitsFrom(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digitsFrom(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}
