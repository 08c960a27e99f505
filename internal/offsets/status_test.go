package offsets

import (
	"context"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"testing"
)

// TestStatusFlagsWatermarksOutsideTheLog writes watermarks past the log end and below the
// log start by hand: both must be reported as drift, never as aligned.
func TestStatusFlagsWatermarksOutsideTheLog(t *testing.T) {
	b := setup(t) // ten records on partition 0: log [0, 10)
	ctx := context.Background()
	for _, c := range []struct {
		next  int64
		state offsetstate.State
	}{{100, offsetstate.WatermarkPastLogEnd}, {10, offsetstate.KafkaMissing}} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.op.store.Tables().Watermarks+` (group_id, topic, partition, next_offset, first_offset)
			VALUES ($1, $2, 0, $3, 0) ON CONFLICT (group_id, topic, partition) DO UPDATE SET next_offset = excluded.next_offset`, b.group, b.topic, c.next); err != nil {
			t.Fatal(err)
		}
		sts, err := b.op.Status(ctx, b.group, b.topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(sts) != 1 || sts[0].State != c.state || !sts[0].Drifted() {
			t.Fatalf("watermark %d: status %+v, want state %s (drift)", c.next, sts, c.state)
		}
	}
}
