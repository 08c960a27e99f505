package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
)

// termText is how every text output of the command writes a string read from the database or
// Kafka — a topic, a consumer group, an error class or message, a stack, an audit actor or
// reason, a member's client id — and the flag values it echoes next to them: as is when
// printable, else Go-quoted with its control characters, bidi overrides and invalid UTF-8
// escaped (\x1b, \n, \u202e; flagcheck.Text), the escaping viewBytes gives a key's or value's
// bytes. A JSON output needs no such step: encoding/json escapes control characters.
func termText(s string) string { return flagcheck.Text(s) }

// valuePrefixBytes is how much of a value list and show print by default.
const valuePrefixBytes = 24

// bytesView describes key, value or header bytes without printing them in full, since they
// may hold personal data: size, SHA-256 and a short Go-escaped prefix. Full is set only when
// the operator asked for it (--show-value).
type bytesView struct {
	Null   bool   `json:"null,omitempty"`
	Size   int    `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	Full   string `json:"full,omitempty"` // Go-quoted, all bytes
}

func viewBytes(b []byte, full bool, prefix int) bytesView {
	if b == nil {
		return bytesView{Null: true}
	}
	sum := sha256.Sum256(b)
	v := bytesView{Size: len(b), SHA256: hex.EncodeToString(sum[:])}
	if full {
		v.Full = strconv.Quote(string(b))
		return v
	}
	if len(b) > prefix {
		v.Prefix = strconv.Quote(string(b[:prefix])) + "…"
	} else {
		v.Prefix = strconv.Quote(string(b))
	}
	return v
}

func (v bytesView) String() string {
	switch {
	case v.Null:
		return "null"
	case v.Full != "":
		return fmt.Sprintf("%d bytes sha256:%s %s", v.Size, v.SHA256[:16], v.Full)
	default:
		return fmt.Sprintf("%d bytes sha256:%s %s", v.Size, v.SHA256[:16], v.Prefix)
	}
}
