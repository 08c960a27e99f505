package kafkatx

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 48, 5: a consumer restarted by its supervisor on a recreated topic wrote one halt
// audit row per start (52 in 30 s). A halt is recorded once per change: started again on the
// same halt (same group, topic, partition, range and reason, which names both log ids) with
// nothing recorded since, no new row; after another audit row of the partition, the halt is
// recorded again.
func TestHaltIsRecordedOncePerChange(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(5, 0, func(i int) string { return fmt.Sprint("old-", i) }))
	b.runUntilWatermark(t, b.handler(), b.config(t), 5)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, values(8, 0, func(i int) string { return fmt.Sprint("new-", i) }))
	for i := 0; i < 4; i++ {
		var lce *LogChangedError
		if err := b.runUntilHalt(t, b.config(t)); !errors.As(err, &lce) {
			t.Fatalf("start %d: Run returned %v, want a *LogChangedError", i+1, err)
		}
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt'"); n != 1 {
		t.Fatalf("%d halt audit rows after 4 starts on the same recreated topic, want 1", n)
	}
	// Something recorded on the partition since (here an operator's align): the next halt is a
	// new row.
	b.exec(t, `INSERT INTO {{schema}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor)
		VALUES ($1, $2, 0, 'align', 5, 5, 'test', 'test')`, b.group, b.topic)
	if err := b.runUntilHalt(t, b.config(t)); !errors.As(err, new(*LogChangedError)) {
		t.Fatalf("Run returned %v, want a *LogChangedError", err)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'halt'"); n != 2 {
		t.Fatalf("%d halt audit rows after a change was recorded between two halts, want 2", n)
	}
}
