package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/idempotency"
)

type nilPtrErr struct{ msg string }

func (e *nilPtrErr) Error() string { return e.msg }

type panickyAs struct{}

func (panickyAs) Error() string { return "panicky" }
func (panickyAs) As(any) bool   { panic("As of a user error type") }

// TestSortKeepsTheHandlersOwnFailuresAsAttempts needs no services: with the worker's context
// alive and the transaction's connection open, only a retryable SQLSTATE runs the transaction
// again; the handler's own deadline, cancellation, network and HTTP errors are failures
// (attempts). Before, any context.DeadlineExceeded and any net.Error were "again" — the
// message re-ran for ever — while a bare context.Canceled was a failure.
func TestSortKeepsTheHandlersOwnFailuresAsAttempts(t *testing.T) {
	live := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		want Verdict
	}{
		{"nil", nil, Done},
		{"deadlock 40P01", fmt.Errorf("update: %w", &pgconn.PgError{Code: "40P01"}), Again},
		{"admin shutdown 57P01 (its connection open)", &pgconn.PgError{Code: "57P01"}, Wait},
		{"disk full 53100", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "53100"}), Wait},
		{"too many connections 53300", &pgconn.PgError{Code: "53300"}, Wait},
		{"io error 58030", &pgconn.PgError{Code: "58030"}, Wait},
		{"read-only 25006", &pgconn.PgError{Code: "25006"}, Wait},
		{"lock timeout 55P03", &pgconn.PgError{Code: "55P03"}, Again},
		{"out of memory 53200: the statement's", &pgconn.PgError{Code: "53200"}, Failed},
		{"temp_file_limit 53400: the statement's", &pgconn.PgError{Code: "53400"}, Failed},
		{"a handler's own ConnectError", &pgconn.ConnectError{}, Failed},
		{"unique violation", &pgconn.PgError{Code: "23505"}, Failed},
		{"statement timeout 57014", &pgconn.PgError{Code: "57014"}, Failed},
		{"own deadline, wrapped", fmt.Errorf("call pricing API: %w", context.DeadlineExceeded), Failed},
		{"bare DeadlineExceeded", context.DeadlineExceeded, Failed},
		{"bare Canceled", context.Canceled, Failed},
		{"dial i/o timeout", &net.OpError{Op: "dial", Net: "tcp", Err: &timeoutErr{}}, Failed},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, Failed},
		{"HTTP client", &url.Error{Op: "Get", URL: "http://x", Err: syscall.ECONNREFUSED}, Failed},
		{"conn closed text", errors.New("conn closed"), Failed}, // the tx's connection is asked, not the text
		{"plain", errors.New("bad order"), Failed},
	} {
		if v, err := Sort(live, nil, tc.err); v != tc.want || err != tc.err {
			t.Errorf("%s: Sort = %v, %v; want %v", tc.name, v, err, tc.want)
		}
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if v, _ := Sort(done, nil, context.Canceled); v != Again {
		t.Errorf("the worker's own cancellation: %v, want again", v)
	}
	if v, _ := Sort(live, nil, fmt.Errorf("call: %w", unavailableErr{})); v != Wait {
		t.Errorf("unavailable: %v, want wait", v)
	}
	v, err := Sort(live, nil, panickyAs{})
	var pe *Panic
	if v != Failed || !errors.As(err, &pe) || len(pe.Stack) == 0 {
		t.Errorf("an error whose As panics: %v, %v; want failed with a *Panic", v, err)
	}
}

// unavailableErr is a dependency's failure marked by its method, as *kafkatx.UnavailableError is.
type unavailableErr struct{}

func (unavailableErr) Error() string     { return "down" }
func (unavailableErr) Unavailable() bool { return true }

type timeoutErr struct{}

func (*timeoutErr) Error() string   { return "i/o timeout" }
func (*timeoutErr) Timeout() bool   { return true }
func (*timeoutErr) Temporary() bool { return true }

// TestCallCatchesAnErrorValueThatPanicsWhenPrinted: a nil *T returned as an error, whose Error
// dereferences it, is a *Panic from Call rather than a panic in the loop's log or describe.
func TestCallCatchesAnErrorValueThatPanicsWhenPrinted(t *testing.T) {
	err := Call(func() error { var e *nilPtrErr; return e })
	var pe *Panic
	if !errors.As(err, &pe) {
		t.Fatalf("Call = %v, want a *Panic", err)
	}
	if class, _, stack := Describe(err); class != ClassPanic || stack == "" {
		t.Errorf("Describe = %s (stack %d bytes), want panic with its stack", class, len(stack))
	}
}

// TestClaimKeysRecoversAKeyFunctionPanic: the key function's panic fails its message with a
// *Panic (class panic, stack kept) and goes no further. Before, it escaped ClaimKeys and ended
// the process.
func TestClaimKeysRecoversAKeyFunctionPanic(t *testing.T) {
	key := func(m idempotency.Message) (string, bool, error) {
		if string(m.Value) == "p" {
			panic("key func panic")
		}
		return "", false, nil
	}
	msgs := []idempotency.Message{{Value: []byte("a")}, {Value: []byte("p")}, {Value: []byte("b")}}
	_, failed, kerr, err := ClaimKeys(context.Background(), nil, idempotency.Store{}, "g/0", key, msgs)
	var pe *Panic
	if err != nil || failed != 1 || !errors.As(kerr, &pe) {
		t.Fatalf("ClaimKeys = failed %d, %v, %v; want message 1 failed with a *Panic", failed, kerr, err)
	}
	class, msg, stack := Describe(kerr)
	if class != ClassPanic || !strings.Contains(msg, "idempotency key function") || !strings.Contains(stack, "TestClaimKeysRecoversAKeyFunctionPanic") {
		t.Errorf("Describe = %s %q, stack %d bytes; want panic naming the key function, with its stack", class, msg, len(stack))
	}
	if GiveUp(class, 1, 5) || !GiveUp(class, 5, 5) {
		t.Error("a key function panic is not retried like a handler panic")
	}
}
