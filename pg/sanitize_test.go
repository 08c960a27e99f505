package pg

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSanitizeTextKeepsCleanTextAndFixesTheRest(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, "plain"},
		{"nul\x00byte", 100, "nul\u2400byte"},
		{"bad\xff\xfeutf8", 100, "bad\uFFFDutf8"},
		{"héllo", 2, "h"}, // never cut inside a rune
		{"héllo", 3, "hé"},
	} {
		if got := SanitizeText(c.in, c.max); got != c.want {
			t.Errorf("SanitizeText(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func FuzzSanitizeText(f *testing.F) {
	f.Add("malformed_message", 64)
	f.Add("\x00\xff\xfe\x80", 3)
	f.Add(strings.Repeat("é", 100), 7)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		got := SanitizeText(s, max)
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || len(got) > max {
			t.Fatalf("SanitizeText(%q, %d) = %q: invalid, has NUL or longer than max", s, max, got)
		}
	})
}
