// Package msgfmt writes values into kafkatx's messages the one way the library, the kafkatx
// command and the examples all write them: Quote for a name given by a user (a flag value, a
// consumer group, a topic) inside a command to copy, Text for any text read from the database
// or Kafka (a topic, an error message, a reason) written to a terminal, Thousands for a number
// (a bound's range). The command's package flagcheck (module github.com/kafkatx/kafkatx/cmd)
// exposes them to the kafkatx command and the examples.
package msgfmt

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Quote returns s as one shell word: as is when it is plain ([A-Za-z0-9_.,:/@%+=-]), else in
// single quotes, a single quote inside written as quote, backslash, quote, quote; the empty
// string as a pair of single quotes. When s is not printable (a control character, a bidi
// override, invalid UTF-8: see printable), the word is bash's $'...' with Text's escapes
// (\x1b, \n, \u202e; a single quote as \'), so no such byte reaches the terminal and the word
// pasted into bash is s again.
func Quote(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.,:/@%+=-", r)) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	if !printable(s) {
		q := strconv.Quote(s)
		return "$'" + strings.ReplaceAll(q[1:len(q)-1], "'", `\'`) + "'"
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Text returns s as it may be written to a terminal or a text output: as is when it is valid
// UTF-8 of printable runes with no backslash (see printable), else Go-quoted (strconv.Quote:
// "..." with \x1b, \n, \r, \t, \u202e, \\ and \" escaped, invalid UTF-8 as \xff), the escaping the kafkatx command gives a key's or value's
// bytes. So text from the database or Kafka (a topic, a consumer group, a handler's error message, an
// audit reason) can neither move the cursor, recolour the screen, reorder what follows (bidi
// overrides), nor forge a line of its own; a quoted result is always the escaped form, since
// a plain one holds no backslash.
func Text(s string) string {
	if printable(s) && !strings.ContainsRune(s, '\\') {
		return s
	}
	return strconv.Quote(s)
}

// printable reports whether s is valid UTF-8 of printable runes (strconv.IsPrint: letters,
// marks, numbers, punctuation, symbols and the ASCII space; not a C0 or C1 control character
// such as ESC, CR, LF or TAB, not a format character such as the bidi overrides
// U+202A–U+202E and isolates U+2066–U+2069, not a line or paragraph separator).
func printable(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return false
			}
		}
		if !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

// Thousands writes n with thousands separators (100,000; -1,024), as the docs and every
// bound's message do.
func Thousands(n int) string {
	s := strconv.Itoa(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}
