package httpmw

import (
	"errors"
	"fmt"
	"strings"
)

// parseKey returns the key of an Idempotency-Key field value. The draft defines the field as
// a Structured Field Item whose value is a String (RFC 8941: a quoted string of printable
// ASCII with \" and \\ escapes), for example Idempotency-Key: "8e03978e-40d5". Many clients
// send the bare value (Idempotency-Key: 8e03978e-40d5); it is accepted too, as its printable
// ASCII text. Parameters after a quoted string are ignored.
func parseKey(v string, maxLen int) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errors.New("empty Idempotency-Key")
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		for ; i < len(v); i++ {
			c := v[i]
			if c == '\\' {
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", errors.New("Idempotency-Key: bad escape in quoted string")
				}
				b.WriteByte(v[i])
				continue
			}
			if c == '"' {
				break
			}
			if c < 0x20 || c > 0x7e {
				return "", errors.New("Idempotency-Key: quoted string holds a non-printable or non-ASCII byte")
			}
			b.WriteByte(c)
		}
		if i == len(v) {
			return "", errors.New("Idempotency-Key: unterminated quoted string")
		}
		if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" && rest[0] != ';' {
			return "", errors.New("Idempotency-Key: text after the quoted string")
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				return "", errors.New("Idempotency-Key holds a non-printable or non-ASCII byte")
			}
		}
		key = v
	}
	if key == "" {
		return "", errors.New("empty Idempotency-Key")
	}
	if len(key) > maxLen {
		return "", fmt.Errorf("Idempotency-Key is longer than %d bytes", maxLen)
	}
	return key, nil
}
