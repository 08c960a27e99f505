package kafkatx

import (
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Issue 31 "Defaults and bounds once": Config.validate refuses a numeric field outside its
// Bound, naming the field and the range, and the zero value (the default) and each end of
// the range pass.
func TestConfigValidateRefusesOutOfBounds(t *testing.T) {
	t.Parallel()
	base := func() *Config {
		return &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "b", "group.id": "g"}, Topics: []string{"t"}}
	}
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Concurrency = 1025 }, "kafkatx: Config.Concurrency 1025: want 1 to 1,024 (0: the default)"},
		{func(c *Config) { c.Concurrency = -1 }, "kafkatx: Config.Concurrency -1: want 1 to 1,024"},
		{func(c *Config) { c.Retry.MaxAttempts = 1001 }, "kafkatx: Config.Retry.MaxAttempts 1001: want 1 to 1,000"},
		{func(c *Config) { c.Batch.Size = 100_001 }, "kafkatx: Config.Batch.Size 100001: want 1 to 100,000"},
		{func(c *Config) { c.MaxUnits = -3 }, "kafkatx: Config.MaxUnits -3"},
		// Issue 48: the group id is in B-tree keys (watermarks, dead letters, idempotency scopes).
		{func(c *Config) { c.Kafka["group.id"] = strings.Repeat("g", MaxGroupIDBytes+1) }, "group.id is 501 bytes, more than MaxGroupIDBytes (500)"},
	} {
		cfg := base()
		c.set(cfg)
		if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
	for _, set := range []func(*Config){
		func(*Config) {},
		func(c *Config) { c.Concurrency, c.Retry.MaxAttempts, c.Batch.Size, c.MaxUnits = 1, 1, 1, 1 },
		func(c *Config) { c.Concurrency, c.Retry.MaxAttempts, c.Batch.Size = 1024, 1000, 100_000 },
		func(c *Config) { c.Kafka["group.id"] = strings.Repeat("g", MaxGroupIDBytes) },
	} {
		cfg := base()
		set(cfg)
		if err := cfg.validate(); err != nil {
			t.Errorf("in bounds: %v", err)
		}
	}
}
