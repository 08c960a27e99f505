package msgfmt

import "testing"

func TestQuoteAndThousands(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"orders": "orders", "": "''", "a b": "'a b'", "it's": `'it'\''s'`, "a/b:1@x": "a/b:1@x"} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
	}
	for in, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", -1024: "-1,024", 1234567: "1,234,567"} {
		if got := Thousands(in); got != want {
			t.Errorf("Thousands(%d) = %s, want %s", in, got, want)
		}
	}
}

// TestTextAndQuoteEscapeWhatATerminalObeys: every control character (C0, C1, ESC, CR, LF),
// bidi override or isolate, and invalid UTF-8 comes out escaped visibly, in Text and in Quote.
func TestTextAndQuoteEscapeWhatATerminalObeys(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"orders":                   "orders",
		"":                         "",
		"no such topic: orders.v2": "no such topic: orders.v2",
		"naïve ünïcode":            "naïve ünïcode",
		"atk\x1b[31mRED\nFAKE":     `"atk\x1b[31mRED\nFAKE"`,
		"a\rb\tc":                  `"a\rb\tc"`,
		"c1\u0085\u009b":           `"c1\u0085\u009b"`,
		"bidi\u202egnp.exe":        `"bidi\u202egnp.exe"`,
		"iso\u2066x\u2069":         `"iso\u2066x\u2069"`,
		"bad\xffutf8":              `"bad\xffutf8"`,
		`C:\dir`:                   `"C:\\dir"`,
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %s, want %s", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"atk\x1b[31m\nx": `$'atk\x1b[31m\nx'`,
		"it's\n":         `$'it\'s\n'`,
		"r\u202eo":       `$'r\u202eo'`,
		`a\b`:            `'a\b'`,
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
	}
}
