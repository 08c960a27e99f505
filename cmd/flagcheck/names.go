package flagcheck

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
)

// MaxIdentifierBytes is PostgreSQL's longest identifier (NAMEDATALEN - 1 = 63 bytes); the
// server silently truncates a longer one.
const MaxIdentifierBytes = 63

// MaxTopicLength is Kafka's longest topic name (249 characters; kafkaname.MaxTopicLength).
const MaxTopicLength = kafkaname.MaxTopicLength

// MaxSelectionBytes bounds a topic given to select existing rows (TopicFilter): the longest
// text kafkatx's tables hold in a topic column is not bounded, a filter is.
const MaxSelectionBytes = 4096

// Schema returns an error unless v can name a PostgreSQL schema as given: not empty, at most
// MaxIdentifierBytes bytes, valid UTF-8 without NUL.
func Schema(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("--%s is empty: want a PostgreSQL schema name (1 to %d bytes)", name, MaxIdentifierBytes)
	case len(v) > MaxIdentifierBytes:
		return fmt.Errorf("--%s %s is %d bytes: PostgreSQL identifiers are at most %d (a longer one is silently truncated)", name, Quote(v), len(v), MaxIdentifierBytes)
	case strings.ContainsRune(v, 0) || !utf8.ValidString(v):
		return fmt.Errorf("--%s %s: not a valid PostgreSQL identifier (NUL or invalid UTF-8)", name, Quote(v))
	}
	return nil
}

// Topic returns an error unless v is a topic name Kafka accepts: 1 to 249 characters of
// [a-zA-Z0-9._-], not "." or ".." (kafkaname.Topic, the rule the relays apply too). For a
// topic kafkatx publishes to or asks Kafka about.
func Topic(name, v string) error {
	err := kafkaname.Topic(v)
	switch {
	case err == nil:
		return nil
	case v == "":
		return fmt.Errorf("--%s is empty: want a Kafka topic name", name)
	case errors.Is(err, kafkaname.ErrTopicTooLong):
		return fmt.Errorf("--%s is %d characters: Kafka topic names are at most %d", name, len(v), MaxTopicLength)
	}
	reason := kafkaname.Reason(v)
	return fmt.Errorf("--%s %s: %s", name, Quote(v), reason)
}

// TopicFilter returns an error unless v can select existing rows by their topic (outbox and
// dead-letter commands' --topic with --all): any text the rows may hold (a row written with
// plain SQL may name a topic Kafka refuses, and is listed under that name), so not empty,
// valid UTF-8 without NUL, at most MaxSelectionBytes bytes.
func TopicFilter(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("--%s is empty: want the topic of the rows to select", name)
	case len(v) > MaxSelectionBytes:
		return fmt.Errorf("--%s is %d bytes: a topic to select rows by is at most %d", name, len(v), MaxSelectionBytes)
	case strings.ContainsRune(v, 0) || !utf8.ValidString(v):
		return fmt.Errorf("--%s: a topic to select rows by must be UTF-8 text without NUL", name)
	}
	return nil
}

// Group returns an error unless v can be a consumer group id: not empty (Kafka refuses an
// empty group.id for a consumer group), no NUL.
func Group(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("--%s is empty: want a consumer group id", name)
	case strings.ContainsRune(v, 0) || !utf8.ValidString(v):
		return fmt.Errorf("--%s %s: a consumer group id must be UTF-8 text without NUL", name, Quote(v))
	}
	return nil
}

// NonEmpty returns an error when v is empty; what says what the flag wants.
func NonEmpty(name, v, what string) error {
	if v == "" {
		return fmt.Errorf("--%s is empty: want %s", name, what)
	}
	return nil
}

// Addr returns an error unless v is HOST:PORT (HOST may be empty: every interface) with a
// port of 0 to 65535, as net.Listen takes it.
func Addr(name, v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--%s %s: want HOST:PORT, such as 127.0.0.1:9090", name, Quote(v))
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--%s %s: the port must be a number from 0 to 65535", name, Quote(v))
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("--%s %s: want HOST:PORT, such as 127.0.0.1:9090", name, Quote(v))
	}
	return nil
}

// KeyValue returns an error unless v is key=value with a non-empty key (a librdkafka property
// on the command line).
func KeyValue(name, v string) error {
	k, _, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("--%s %s: want key=value, such as security.protocol=sasl_ssl", name, Quote(keyOnly(v)))
	}
	return nil
}

// keyOnly is what an error may echo of a key=value argument: the key, never a value.
func keyOnly(v string) string {
	k, _, _ := strings.Cut(v, "=")
	return k
}

// Quote returns s as one shell word: as is when it is plain ([A-Za-z0-9_.,:/@%+=-]), else in
// single quotes; empty as ” (msgfmt.Quote, the library's rule).
func Quote(s string) string { return msgfmt.Quote(s) }

// Text returns s as it may be written to a terminal: as is when it is printable UTF-8 with no
// backslash, else Go-quoted, so no control character (ESC, CR, LF, other C0/C1), bidi
// override or isolate, or invalid UTF-8 byte reaches the terminal raw (msgfmt.Text, the
// library's rule).
func Text(s string) string { return msgfmt.Text(s) }

// JoinNegative returns args with each "--flag -N" (a long flag without "=" followed by a
// negative number) written "--flag=-N", so that a parser which takes "-N" for a short flag
// (kong) reads it as the flag's value and the range check names the flag, instead of
// suggesting the same bad value again. Everything after "--" is left alone.
func JoinNegative(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if strings.HasPrefix(a, "--") && len(a) > 2 && !strings.Contains(a, "=") && i+1 < len(args) && negativeNumber(args[i+1]) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

func negativeNumber(s string) bool {
	if len(s) < 2 || s[0] != '-' || s[1] < '0' || s[1] > '9' {
		return false
	}
	for _, r := range s[1:] {
		if !(r >= '0' && r <= '9' || strings.ContainsRune(".eE+-_smhuµn", r)) {
			return false
		}
	}
	return true
}
