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
