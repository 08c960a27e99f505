// Package kafkaprops reads librdkafka properties files (key=value lines: security.protocol,
// sasl.*, ssl.*, ...): the --kafka-config-file of kafkatx's binaries and the secure broker's
// settings in the library's tests. The command's package of the same name (module
// github.com/kafkatx/kafkatx/cmd) exposes Read to the examples and adds librdkafka's check.
package kafkaprops

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Read adds the key=value lines of the file at path to cfg (later lines win; blank lines and
// lines starting with # or ! are skipped; keys and values are trimmed; a UTF-8 byte-order
// mark at the start of the file is skipped). Errors name the file
// and line, never a value: the file may hold secrets such as sasl.password.
func Read(path string, cfg kafka.ConfigMap) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("kafka config file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n == 1 {
			// A byte-order mark (files saved by some Windows editors) is not part of the first key.
			line = strings.TrimPrefix(line, "\ufeff")
		}
		line = strings.TrimSpace(line)
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
