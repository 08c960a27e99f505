// Package msgfmt writes values into kafkatx's messages the one way the library, the kafkatx
// command and the examples all write them: Quote for a name given by a user (a flag value, a
// consumer group, a topic), Thousands for a number (a bound's range). The command's package
// flagcheck (module github.com/kafkatx/kafkatx/cmd) exposes both to the examples.
package msgfmt

import (
	"strconv"
	"strings"
)

// Quote returns s as one shell word: as is when it is plain ([A-Za-z0-9_.,:/@%+=-]), else in
// single quotes (a ' inside written '\”); empty as ”.
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
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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
