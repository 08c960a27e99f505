package order

import (
	"encoding/json"
	"strconv"
	"testing"
)

func TestParseOrderIsStrictAndExact(t *testing.T) {
	good := map[string]int64{
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":9.99}`:                            1998,
		`{"order_id":"A","customer":"c","item":"w","quantity":3,"price":14.75}`:                           4425,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":39.00}`:                           3900,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":24.5}`:                            2450,
		`{"order_id":"A","customer":"c","item":"w","quantity":1000000,"price":999999999.99}`:              99999999999000000,
		`{"order_id":"A","customer":"c","item":"","quantity":3,"price":0}`:                                0,
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":0.1}`:                             20,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":7.1000}`:                          710,
		` {"quantity":1,"price":1.05,"item":"w","customer":"c","order_id":"A"} `:                          105,
		`{"order_id":"A\u00e9","customer":"c","item":"w","quantity":1,"price":1.05,"note":{"x":[1,"y"]}}`: 105,
	}
	for in, cents := range good {
		o, err := Parse([]byte(in))
		if err != nil || o.TotalCents != cents {
			t.Errorf("Parse(%s) = %d, %v; want %d", in, o.TotalCents, err, cents)
		}
	}
	for _, in := range []string{
		`malformed_message`,
		``,
		`null`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1e308}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":-1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.001}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1000000,"price":999999999999.99}`, // would overflow int64 cents
		`{"order_id":"A\u0000B","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.00} trailing`,
		`{"customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":" ","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"A","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":null,"quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":0,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1.5,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":-1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1e2}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1000000000}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":"abc"}`,
		`{"order_id":"A","customer":"c","item":"\xff","quantity":1,"price":1.00}`,
		`[{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.00}]`,
		"{\"order_id\":\"A\",\"customer\":\"c\",\"item\":\"\xff\",\"quantity\":1,\"price\":1.00}", // raw invalid UTF-8
		"{\"order_id\":\"A\",\"customer\":\"c\tc\",\"item\":\"w\",\"quantity\":1,\"price\":1.00}", // raw control character
		`{"order_id":"A","customer":"c","item":"w","quantity":"1","price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.00,"price":2.00}`,
		`{"order_id":"A","ORDER_ID":"B","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"a\ud800\u0041b","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"a\udc00b","customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"a","customer":"c\ud83d","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.00}]`,
		`{"order_id":7,"customer":"c","item":"w","quantity":1,"price":1.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":01,"price":1.00}`,
	} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) accepted a bad order", in)
		}
	}
}

// BenchmarkParse measures the handler's per-message parsing (go test -bench Parse).
func BenchmarkParse(b *testing.B) {
	msg := []byte(`{"order_id":"o-1732999999-000123","customer":"c-7","item":"widget","quantity":3,"price":24.50}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseIsNoMoreLenientThanEncodingJSON: whatever Parse accepts, encoding/json reads as
// the same order (go -C examples test -fuzz FuzzParse ./orders/order/).
func FuzzParseIsNoMoreLenientThanEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":9.99}`))
	f.Add([]byte(`{"order_id":"A\u00e9\n","customer":"c\"","item":"","quantity":1,"price":0.10,"x":[null]}`))
	f.Add([]byte(`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1.00} x`))
	f.Add([]byte(`{"order_id":"a\ud800\u0041b","customer":"c","item":"w","quantity":1,"price":1.00}`))
	f.Add([]byte(`{"order_id":"a\ud83d\ude00","Customer":"c","item":"w\\u","quantity":1,"price":1.00}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := Parse(b)
		if err != nil {
			return
		}
		var raw struct {
			OrderID  string      `json:"order_id"`
			Customer string      `json:"customer"`
			Item     string      `json:"item"`
			Quantity json.Number `json:"quantity"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatalf("Parse accepted %q, encoding/json refuses it: %v", b, err)
		}
		if raw.OrderID != o.OrderID || raw.Customer != o.Customer || raw.Item != o.Item || raw.Quantity.String() != strconv.FormatInt(o.Quantity, 10) {
			t.Fatalf("Parse(%q) = %+v, encoding/json reads %+v", b, o, raw)
		}
	})
}

// TestParseCommonAgrees: whatever the fast path accepts, the full parse accepts as the same
// order — over the sample orders, the strictness cases and every one-byte change of them
// (deleted, or replaced by a byte that matters to JSON) — and the generated shape takes it.
func TestParseCommonAgrees(t *testing.T) {
	seeds := []string{
		`{"order_id":"o-1732999999-000123","customer":"c-7","item":"widget","quantity":3,"price":24.50}`,
		` {"quantity":1,"price":1.05,"item":"w","customer":"c","order_id":"A"} `,
		"{\"order_id\":\"A\u00e9\",\"customer\":\"c\",\"item\":\"\",\"quantity\":1000000,\"price\":999999999.99}",
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":7.1000}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":0}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":1,"price":1e2}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":-0,"price":-0.0}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":01.00}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":1.}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":1.00,}`,
		`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":1.00}}`,
	}
	for _, g := range seeds[:4] {
		if _, ok := parseCommon([]byte(g)); !ok {
			t.Errorf("parseCommon(%s) took the full path", g)
		}
	}
	check := func(b []byte) {
		o, ok := parseCommon(b)
		if !ok {
			return
		}
		full, err := parseFull(b)
		if err != nil || full != o {
			t.Errorf("parseCommon(%q) = %+v; the full parse: %+v, %v", b, o, full, err)
		}
		if got, err := Parse(b); err != nil || got != o {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", b, got, err, o)
		}
	}
	for _, s := range seeds {
		b := []byte(s)
		check(b)
		for i := range b {
			check(append(append([]byte{}, b[:i]...), b[i+1:]...))
			for _, c := range []byte(" \t\x00\x1f\"\\{}[],:.-+eE019ancu\xff") {
				m := append([]byte{}, b...)
				m[i] = c
				check(m)
			}
		}
	}
}

// FuzzParseCommonAgrees: whatever the fast path accepts, the full parse accepts as the same
// order (go -C examples test -fuzz FuzzParseCommon ./orders/order/).
func FuzzParseCommonAgrees(f *testing.F) {
	f.Add([]byte(`{"order_id":"A","customer":"c","item":"w","quantity":2,"price":9.99}`))
	f.Add([]byte(` {"quantity":1,"price":1.05,"item":"w","customer":"c","order_id":"A"} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, ok := parseCommon(b)
		if !ok {
			return
		}
		if full, err := parseFull(b); err != nil || full != o {
			t.Fatalf("parseCommon(%q) = %+v; the full parse: %+v, %v", b, o, full, err)
		}
	})
}

// BenchmarkParseFull measures the full path alone (fastjson), for comparison with
// BenchmarkParse (the common shape's fast path).
func BenchmarkParseFull(b *testing.B) {
	msg := []byte(`{"order_id":"o-1732999999-000123","customer":"c-7","item":"widget","quantity":3,"price":24.50}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseFull(msg); err != nil {
			b.Fatal(err)
		}
	}
}
