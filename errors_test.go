package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/internal/engine"
)

// TestRetryableDB needs no services: the conditions that re-run a transaction without an
// attempt (docs/design.md, "Retry without an attempt"), and the ones that must not.
func TestRetryableDB(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("commit: %w", &pgconn.PgError{Code: code, Message: "x"}) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"serialization failure 40001", pg("40001"), true},
		{"deadlock 40P01", pg("40P01"), true},
		{"admin shutdown 57P01", pg("57P01"), true},
		{"crash shutdown 57P02", pg("57P02"), true},
		{"cannot connect now 57P03", pg("57P03"), true},
		{"read-only server 25006", pg("25006"), true},
		{"connection failure 08006", pg("08006"), true},
		{"connection does not exist 08003", pg("08003"), true},
		{"unique violation 23505 (the handler's bug, an attempt)", pg("23505"), false},
		{"undefined table 42P01", pg("42P01"), false},
		{"insufficient privilege 42501", pg("42501"), false},
		{"check violation 23514", pg("23514"), false},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"connection reset text", errors.New("read tcp: connection reset by peer"), true},
		{"broken pipe text", errors.New("write: broken pipe"), true},
		{"conn closed", errors.New("conn closed"), true},
		{"unexpected EOF text", fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), true},
		// A statement that ran past its deadline: the database did not answer in time. The
		// worker's own shutdown is told apart through its context, before this is asked.
		{"deadline exceeded", fmt.Errorf("exec: %w", context.DeadlineExceeded), true},
		{"plain handler error", errors.New("bad order"), false},
		// A syscall.Errno satisfies net.Error; a file's error is no lost connection
		// (internal/pgerr's one classification, which the engine asks).
		{"a file's error", &os.PathError{Op: "open", Path: "/tmp/x", Err: syscall.EISDIR}, false},
		{"permanent", Permanent(errors.New("bad")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := engine.RetryableDB(tc.err); got != tc.want {
				t.Errorf("retryableDB(%v) = %v; want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestControlErrorsAreRecognisedByTheirMethods: the engine sorts kafkatx's control errors by
// their methods alone — a panic, a wrapped Permanent and a plain error into the documented
// ErrorClass constants, an Unavailable (wrapped, or inside FailMessage) as one — so nothing of
// package kafkatx is injected into it.
func TestControlErrorsAreRecognisedByTheirMethods(t *testing.T) {
	herr := engine.Call(func() error { panic("boom") })
	if class, msg, stack := engine.Describe(herr); class != ErrorClassPanic || msg != "handler panicked: boom" || stack == "" {
		t.Errorf("Describe(panic) = %q %q (stack %d bytes)", class, msg, len(stack))
	}
	if class, msg, _ := engine.Describe(fmt.Errorf("decode: %w", Permanent(io.ErrUnexpectedEOF))); class != ErrorClassPermanent || msg != io.ErrUnexpectedEOF.Error() {
		t.Errorf("Describe(wrapped Permanent) = %q %q", class, msg)
	}
	if class, msg, _ := engine.Describe(io.EOF); class != ErrorClassHandler || msg != "EOF" {
		t.Errorf("Describe(EOF) = %q %q", class, msg)
	}
	m := &Message{Offset: 7}
	for _, err := range []error{Unavailable(io.EOF), fmt.Errorf("call: %w", Unavailable(io.EOF)), FailMessage(m, Unavailable(io.EOF))} {
		if !engine.IsUnavailable(err) || !IsUnavailable(err) {
			t.Errorf("IsUnavailable(%v) = false", err)
		}
	}
	if engine.IsUnavailable(io.EOF) || engine.PermanentCause(io.EOF) != nil || engine.PermanentCause(Unavailable(io.EOF)) != nil {
		t.Error("a plain error or an Unavailable is taken for a control error it is not")
	}
}

// A LogChangedError found by the running check has no log range (it reads ids only): its text
// names no "log [-1, -1)". One found at an assignment names the new log's range. One whose
// watermark was moved onto another log under the consumer (MovedAway) says so, not "the
// topic was deleted and created again".
func TestLogChangedErrorTexts(t *testing.T) {
	base := LogChangedError{Group: "g", Topic: "t", Partition: 0, Watermark: 50, RecordedTopicID: "old-id", TopicID: "new-id"}
	running := base
	running.LogStart, running.LogEnd, running.Running, running.AppliedFrom = -1, -1, true, 50
	assigned := base
	assigned.LogStart, assigned.LogEnd = 0, 7
	moved := base
	moved.LogStart, moved.LogEnd, moved.MovedAway = -1, -1, true
	for _, c := range []struct {
		e           LogChangedError
		want, avoid []string
	}{
		{running, []string{"old-id -> new-id", "processed nothing"}, []string{"[-1, -1)", "log ["}},
		{assigned, []string{"old-id -> new-id", "(log [0, 7))"}, []string{"[-1, -1)"}},
		{moved, []string{"moved onto another log", "topic id old-id", "reads topic id new-id", "--group"}, []string{"[-1, -1)", "deleted and created again"}},
	} {
		s := c.e.Error()
		for _, w := range c.want {
			if !strings.Contains(s, w) {
				t.Errorf("%q does not say %q", s, w)
			}
		}
		for _, a := range c.avoid {
			if strings.Contains(s, a) {
				t.Errorf("%q says %q", s, a)
			}
		}
	}
}
