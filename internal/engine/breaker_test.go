package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

func at(p int32, off int64) Position {
	return Position{TP: offsetstore.TP{Topic: "t", Partition: p}, Offset: off}
}

// TestBreakerOpensOnSharedFailuresOnly: the decision, event by event.
func TestBreakerOpensOnSharedFailuresOnly(t *testing.T) {
	var events []bool
	b := newBreaker(3, time.Millisecond, time.Hour, zap.NewNop(), func(open bool, _ BreakerState) { events = append(events, open) })
	renamed := fmt.Errorf("insert: %w", &pgconn.PgError{Code: "42703", Message: `column "value" does not exist`})
	// Three partitions meet a pill each at once: no partition moved on; not open.
	for p := int32(0); p < 3; p++ {
		if b.failed(at(p, 10), errors.New("decode order 17: poison"), true) {
			t.Fatal("held a pill")
		}
	}
	if b.State() != nil {
		t.Fatal("open on three pills met at once")
	}
	// The same message failing again is not a new message.
	b.failed(at(0, 10), errors.New("decode order 17: poison"), true)
	if b.State() != nil {
		t.Fatal("open on a retried pill")
	}
	// A success ends the spell.
	b.succeeded()
	// A shared failure: partitions 0 and 1, then partition 0 moved on and fails alike.
	for _, pos := range []Position{at(0, 11), at(1, 20), at(0, 12)} {
		b.failed(pos, renamed, true)
	}
	s := b.State()
	if s == nil || s.SQLState != "42703" || s.Messages != 3 || s.Signature != "SQLSTATE 42703" {
		t.Fatalf("state after three messages alike: %+v", s)
	}
	// Open: the same failure is held, another is not.
	if !b.failed(at(2, 30), renamed, true) || b.failed(at(2, 31), errors.New("poison"), true) {
		t.Fatal("hold decisions while open")
	}
	if len(b.State().Held) != 2 { // the one that opened it and the one held since
		t.Fatalf("held partitions: %v", b.State().Held)
	}
	b.succeeded()
	if b.State() != nil || len(events) != 2 || !events[0] || events[1] {
		t.Fatalf("after a success: %+v, events %v", b.State(), events)
	}
	// Digits do not make failures different.
	for _, pos := range []Position{at(0, 1), at(0, 2), at(1, 3)} {
		b.failed(pos, fmt.Errorf("POST /orders/%d: 500 Internal Server Error", pos.Offset), true)
	}
	if b.State() == nil {
		t.Fatal("a dependency failing for everyone did not open it")
	}
	b.succeeded()
	// Bounded: open longer than maxOpen, it holds no more.
	b2 := newBreaker(3, time.Millisecond, 10*time.Millisecond, zap.NewNop(), nil)
	for _, pos := range []Position{at(0, 1), at(0, 2), at(1, 3)} {
		b2.failed(pos, renamed, true)
	}
	time.Sleep(20 * time.Millisecond)
	if b2.failed(at(1, 3), renamed, true) {
		t.Fatal("held past its bound")
	}
	// Disabled.
	off := newBreaker(-1, 0, time.Hour, zap.NewNop(), nil)
	for i := int64(0); i < 10; i++ {
		if off.failed(at(0, i), renamed, true) {
			t.Fatal("a disabled breaker held")
		}
	}
}
