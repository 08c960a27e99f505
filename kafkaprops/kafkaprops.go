// Package kafkaprops reads librdkafka properties files: the --kafka-config-file of kafkatx's
// binaries (security.protocol, sasl.*, ssl.*, ...).
package kafkaprops

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Read adds the key=value lines of the file at path to cfg (later lines win; blank lines and
// lines starting with # or ! are skipped; keys and values are trimmed). Errors name the file
// and line, never a value: the file may hold secrets such as sasl.password.
func Read(path string, cfg kafka.ConfigMap) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("kafka config file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("kafka config file %s line %d: want key=value", path, n)
		}
		cfg[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("kafka config file %s: %w", path, err)
	}
	return nil
}

// Check asks librdkafka whether it accepts every setting of cfg, as a client made from it
// would: a property it does not know, or a value it refuses (not among a property's choices,
// out of range, not a number) is an error naming the property — the usage error of a bad
// --kafka-config-file, -X or security flag, reported before anything connects (a client made
// later failed at run time, exit status 1). It makes a producer without bootstrap servers (so
// nothing connects) and closes it; consumer properties are checked too. Properties the Go
// client handles itself (go.*) are left out. The error never shows a value: cfg may hold
// secrets (sasl.password, ssl.key.password), and librdkafka quotes the value it refuses.
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
		return fmt.Errorf("kafka settings: %s", redact(err.Error()))
	}
	p.Close()
	return nil
}

// quoted matches librdkafka's quoted strings (property names and refused values),
// propertyName the name in "... property \"NAME\"" or "property: \"NAME\"".
var (
	quoted       = regexp.MustCompile(`"[^"]*"`)
	propertyName = regexp.MustCompile(`property:? ("[^"]*")`)
	// a number out of range: `property "NAME" value -5 is outside allowed range 0..900000`
	unquotedValue = regexp.MustCompile(`value \S+ is`)
)

// redact keeps the quoted property name of a librdkafka configuration error (`property
// "NAME"`) and replaces every other quoted string — the refused value — with "…".
func redact(msg string) string {
	name := ""
	if m := propertyName.FindStringSubmatch(msg); m != nil {
		name = m[1]
	}
	msg = quoted.ReplaceAllStringFunc(msg, func(q string) string {
		if q == name {
			return q
		}
		return `"…"`
	})
	return unquotedValue.ReplaceAllString(msg, "value … is")
}
