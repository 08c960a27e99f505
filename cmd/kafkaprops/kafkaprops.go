// Package kafkaprops reads librdkafka properties files: the --kafka-config-file of kafkatx's
// binaries (security.protocol, sasl.*, ssl.*, ...), and checks the settings with librdkafka
// before anything connects. A package of the command's module (github.com/kafkatx/kafkatx/cmd),
// not of the library: public so that a copy of an example builds outside this repository.
package kafkaprops

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	libprops "github.com/kafkatx/kafkatx/internal/kafkaprops"
)

// Read adds the key=value lines of the file at path to cfg (later lines win; blank lines and
// lines starting with # or ! are skipped; keys and values are trimmed; a UTF-8 byte-order
// mark at the start of the file is skipped). Errors name the file and line, never a value:
// the file may hold secrets such as sasl.password. The library's rule (its tests read the
// same files): internal/kafkaprops.Read.
func Read(path string, cfg kafka.ConfigMap) error { return libprops.Read(path, cfg) }

// Check asks librdkafka whether it accepts every setting of cfg, as a client made from it
// would: a property it does not know, or a value it refuses (not among a property's choices,
// out of range, not a number, an unsupported SASL mechanism) is an error naming the property
// — the usage error of a bad --kafka-config-file, -X or security flag, reported before
// anything connects (a client made later failed at run time, exit status 1). It makes a
// producer without bootstrap servers (so nothing connects) and closes it; consumer properties
// are checked too. Properties the Go client handles itself (go.*) are left out. The error is
// one line and never shows a value: cfg may hold secrets (sasl.password, ssl.key.password, or
// one put where it does not belong), and librdkafka's messages quote the value they refuse;
// every value of cfg of 3 bytes or more, and a number named out of range, reads "…".
func Check(cfg kafka.ConfigMap) error {
	probe := kafka.ConfigMap{"log_level": 0} // no lines for the probe's own warnings
	for k, v := range cfg {
		if k == "bootstrap.servers" || strings.HasPrefix(k, "go.") || k == "log_level" {
			continue
		}
		probe[k] = v
	}
	// A producer warns (at the level log_level hides), not fails, on consumer properties;
	// their values are still checked.
	p, err := kafka.NewProducer(&probe)
	if err != nil {
		return fmt.Errorf("kafka settings: %s", nameAliases(Redact(err.Error(), cfg), cfg))
	}
	p.Close()
	return nil
}

// aliases maps librdkafka's canonical property names, which its errors use, to their alias
// (CONFIGURATION.md: "Alias for"): an error about a value set under the alias names the other.
var aliases = map[string]string{
	"request.required.acks":                 "acks",
	"queue.buffering.max.ms":                "linger.ms",
	"message.send.max.retries":              "retries",
	"compression.codec":                     "compression.type",
	"max.in.flight.requests.per.connection": "max.in.flight",
	"metadata.broker.list":                  "bootstrap.servers",
	"sasl.mechanisms":                       "sasl.mechanism",
	"message.timeout.ms":                    "delivery.timeout.ms",
}

// nameAliases adds " (set as ALIAS)" after each canonical property msg quotes that cfg does
// not hold but holds under its alias.
func nameAliases(msg string, cfg kafka.ConfigMap) string {
	for prop, alias := range aliases {
		q := `"` + prop + `"`
		if !strings.Contains(msg, q) {
			continue
		}
		if _, ok := cfg[prop]; ok {
			continue
		}
		if _, ok := cfg[alias]; ok {
			msg = strings.ReplaceAll(msg, q, q+" (set as "+alias+")")
		}
	}
	return msg
}

// outOfRange matches a number librdkafka names out of range: `property "NAME" value -5 is
// outside allowed range 0..900000`.
var outOfRange = regexp.MustCompile(`value \S+ is`)

// Redact returns msg on one line with every value of cfg of 3 bytes or more (as text), and a
// number named out of range, replaced by "…"; property names (cfg's keys) stay. For messages
// about cfg that may quote a value: librdkafka's configuration errors and warnings.
func Redact(msg string, cfg kafka.ConfigMap) string {
	msg = strings.TrimSuffix(strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", " ; ")), " "), " ;")
	var values []string
	for k, v := range cfg {
		s := fmt.Sprint(v)
		if len(s) >= 3 && s != k {
			values = append(values, s)
		}
	}
	// Property names stay whole, even where a value is part of one ("ssl" of
	// security.protocol=ssl inside "ssl.key.location"): each is swapped for a placeholder
	// while the values are replaced.
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for i, k := range keys {
		msg = strings.ReplaceAll(msg, k, fmt.Sprintf("\x00%d\x00", i))
	}
	// Longest first: a value inside another is replaced within the longer one's "…".
	sort.Slice(values, func(i, j int) bool { return len(values[i]) > len(values[j]) })
	for _, v := range values {
		msg = strings.ReplaceAll(msg, v, "…")
	}
	for i, k := range keys {
		msg = strings.ReplaceAll(msg, fmt.Sprintf("\x00%d\x00", i), k)
	}
	return outOfRange.ReplaceAllString(msg, "value … is")
}
