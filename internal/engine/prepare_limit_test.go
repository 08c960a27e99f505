package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/kafkatx/kafkatx/limit"
)

// TestPreparedFeedsItsLimit: a Prepare answering Unavailable counts as a dropped call (the
// limit halves), a success as a sample, a handler-style failure as nothing; every permit is
// given back; a context that ends while waiting for a permit is Again, not an attempt.
func TestPreparedFeedsItsLimit(t *testing.T) {
	l := limit.MustNew(limit.Config{Initial: 16})
	var answer error
	b := &Body[int]{Prepare: func(context.Context, []int) error { return answer }, PrepareLimit: l}
	answer = errors.New("bad message")
	if tr := b.Prepared(context.Background(), []int{1}); tr.Verdict != Failed || l.Limit() != 16 {
		t.Fatalf("handler-style failure: %v, limit %d (want Failed, 16)", tr.Verdict, l.Limit())
	}
	answer = unavailableErr{}
	if tr := b.Prepared(context.Background(), []int{1}); tr.Verdict != Wait || l.Limit() != 8 {
		t.Fatalf("unavailable: %v, limit %d (want Wait, 8)", tr.Verdict, l.Limit())
	}
	if l.InFlight() != 0 {
		t.Fatalf("%d permits held after Prepared returned", l.InFlight())
	}
	one := &Body[int]{Prepare: func(context.Context, []int) error { return nil }, PrepareLimit: limit.Fixed(1)}
	p, _ := one.PrepareLimit.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tr := one.Prepared(ctx, []int{1}); tr.Verdict != Again {
		t.Fatalf("ctx ended while waiting for a permit: %v, want Again", tr.Verdict)
	}
	p.Done(limit.Success)
	if tr := one.Prepared(context.Background(), []int{1}); tr.Verdict != Done {
		t.Fatalf("%v, want Done", tr.Verdict)
	}
}
