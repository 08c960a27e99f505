package kafkatx

import (
	"fmt"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
)

// Bound is the range Config.validate allows one of Config's numeric fields, inclusive. Zero
// always means the field's default and is allowed; NewConsumer refuses any other value
// outside [Min, Max] with an error naming the field and the range. The binaries' flags for
// these fields (--concurrency, --max-attempts, --batch-size) check the same Bound, so a flag
// and the field it sets refuse alike (franz-go's validate table, one place for each range).
type Bound struct {
	Field    string // the field's path in Config: "Concurrency", "Retry.MaxAttempts", ...
	Min, Max int    // inclusive
}

// The bounds of Config's numeric fields.
var (
	// ConcurrencyBound: 1 to 1,024 units of one partition in flight (lanes are fixed slots:
	// more would only hold memory and pooled connections).
	ConcurrencyBound = Bound{Field: "Concurrency", Min: 1, Max: 1024}
	// MaxAttemptsBound: 1 to 1,000 tries before a message is dead-lettered.
	MaxAttemptsBound = Bound{Field: "Retry.MaxAttempts", Min: 1, Max: 1000}
	// BatchSizeBound: 1 to 100,000 messages of one partition per transaction.
	BatchSizeBound = Bound{Field: "Batch.Size", Min: 1, Max: 100_000}
	// MaxUnitsBound: 1 to 65,536 units in flight over the whole consumer.
	MaxUnitsBound = Bound{Field: "MaxUnits", Min: 1, Max: 65_536}
)

// Check returns an error unless v is in b's range: "NAME v: want Min to Max". name is the
// caller's word for it (Config's field, or a flag such as "--concurrency").
func (b Bound) Check(name string, v int) error {
	if v < b.Min || v > b.Max {
		return fmt.Errorf("%s %d: want %s to %s", name, v, msgfmt.Thousands(b.Min), msgfmt.Thousands(b.Max))
	}
	return nil
}

// validateBounds checks c's numeric fields against their Bound (zero: the default).
func (c *Config) validateBounds() error {
	for _, f := range []struct {
		b Bound
		v int
	}{{ConcurrencyBound, c.Concurrency}, {MaxAttemptsBound, c.Retry.MaxAttempts}, {BatchSizeBound, c.Batch.Size}, {MaxUnitsBound, c.MaxUnits}} {
		if f.v == 0 {
			continue
		}
		if err := f.b.Check("kafkatx: Config."+f.b.Field, f.v); err != nil {
			return fmt.Errorf("%w (0: the default)", err)
		}
	}
	return nil
}
