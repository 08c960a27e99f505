package offsets

import (
	"context"
	"testing"
)

// Parked messages are accounted for (offsets account counts them apart), and a replay through
// a parked offset deletes its row: the replay reads it again from Kafka, so it is neither run
// twice nor parked twice (its row would collide with the new parking and hold the partition).
func TestParkedOffsetsAccountedAndReplayedOnce(t *testing.T) {
	b := setup(t)
	b.park = true
	parked := func() int64 { return b.q(`SELECT count(*) FROM %s.key_parking WHERE group_id = $1`, b.group) }
	b.run("watermark 10 past the parked offset 3", func() bool { return b.watermark() == 10 && parked() == 1 })
	ctx := context.Background()
	as, err := b.op.Account(ctx, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0].Parked != 1 || as[0].Processed != 9 || as[0].Offsets != 10 || len(as[0].Gaps) != 0 {
		t.Fatalf("account %+v: want 10 offsets, 9 processed, 1 parked, no gaps", as)
	}
	sts, err := b.op.Status(ctx, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || sts[0].Parked != 1 || sts[0].ParkedKeys != 1 {
		t.Fatalf("status %+v: want 1 parked message of 1 key", sts)
	}
	plan, err := b.op.PlanReset(ctx, ResetRequest{Group: b.group, Topic: b.topic, Partition: 0, Target: Target{Kind: TargetOffset, Offset: 2}, Mode: ModeReplay, Reason: "re-run"})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Steps) != 1 || plan.Steps[0].ParkedReplayed != 1 {
		t.Fatalf("plan %+v: want the replay's step to name the 1 parked message it deletes", plan.Steps)
	}
	if err := b.op.ExecuteReset(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if n := parked(); n != 0 {
		t.Fatalf("%d parked rows left inside the replayed range", n)
	}
	b.run("the replay through the parked offset", func() bool { return b.watermark() == 10 && parked() == 1 })
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE "offset" >= 2 AND applied = 2`); n != 7 {
		t.Fatalf("%d of the 7 replayed messages (offset 3 still parked) ran exactly twice", n)
	}
	if n := b.q(`SELECT count(*) FROM %s.effects WHERE "offset" = 3`); n != 0 {
		t.Fatal("the parked offset 3 was applied")
	}
}
