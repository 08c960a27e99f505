package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/idempotency"
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

// TestPreparedNamesTheRefusedKey: the limit learns which record key a Prepare answered
// Unavailable for (the message it named), so that one key refused again and again shrinks it
// once — its first refusal — and not on every try; another key's refusal, and the database's
// own condition (no key's), still halve it; a success of a one-message unit forgets the key.
func TestPreparedNamesTheRefusedKey(t *testing.T) {
	l := limit.MustNew(limit.Config{Initial: 64, ProbeFirst: -1, ProbeInterval: -1})
	var answer error
	b := &Body[string]{
		Prepare:      func(context.Context, []string) error { return answer },
		PrepareLimit: l,
		Keyed:        func(k string) idempotency.Message { return idempotency.Message{Key: []byte(k)} },
	}
	answer = unavailableErr{}
	if tr := b.Prepared(context.Background(), []string{"row-7"}); tr.Verdict != Wait || l.Limit() != 32 {
		t.Fatalf("row-7's first refusal: %v, limit %d (want Wait, 32)", tr.Verdict, l.Limit())
	}
	for i := range 20 {
		if tr := b.Prepared(context.Background(), []string{"row-7"}); tr.Verdict != Wait || l.Limit() != 32 {
			t.Fatalf("row-7 refused again (%d): %v, limit %d (want Wait, 32)", i, tr.Verdict, l.Limit())
		}
	}
	if b.Prepared(context.Background(), []string{"row-8"}); l.Limit() != 16 {
		t.Fatalf("another key's first refusal: limit %d, want 16", l.Limit())
	}
	answer = &pgconn.PgError{Code: "53300"} // too_many_connections: the database's, no key's
	if tr := b.Prepared(context.Background(), []string{"row-7"}); tr.Verdict != Wait || l.Limit() != 8 {
		t.Fatalf("the database's own condition: %v, limit %d (want Wait, 8)", tr.Verdict, l.Limit())
	}
	if l.Refusing() != 2 {
		t.Fatalf("Refusing() = %d, want row-7 and row-8", l.Refusing())
	}
	answer = nil
	if tr := b.Prepared(context.Background(), []string{"row-7"}); tr.Verdict != Done || l.Refusing() != 1 {
		t.Fatalf("row-7's success: %v, %d keys refusing (want Done, 1)", tr.Verdict, l.Refusing())
	}
}
