package httpmw

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// insertWork writes the handler's row in the middleware's transaction.
func insertWork(t *testing.T, b *testBundle, r *http.Request) {
	if _, err := Tx(r.Context()).Exec(r.Context(), "INSERT INTO "+pgx.Identifier{b.schema, "work"}.Sanitize()+" (key, body) VALUES ($1, 'x')", Key(r.Context())); err != nil {
		t.Error(err)
	}
}

// A client that gives up during the call (a task process killed, an execution_timeout, a
// urlopen timeout): the handler sees its context end and returns without writing. Nothing is
// stored — before the fix a 200 with an empty body was stored and replayed to every retry.
func TestCancelledRequestStoresNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	var calls atomic.Int32
	b.serve(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertWork(t, b, r)
		if calls.Add(1) == 1 {
			<-r.Context().Done() // the way examples/dagservice's delay gives up
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/tasks/score", strings.NewReader("{}"))
	req.Header.Set(HeaderKey, "d/r/t/0")
	if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first call: %v; want the client's timeout", err)
	}
	// The handler's rollback happens after the client left: wait until the key is free.
	var r response
	for i := 0; i < 50; i++ {
		if r = b.post(t, "d/r/t/0", "{}"); r.status != http.StatusConflict {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.status != 200 || r.body != `{"ok":true}` || r.header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry after a cancelled call: %d %q replayed=%q; want a fresh 200 with the JSON answer", r.status, r.body, r.header.Get(HeaderReplayed))
	}
	if calls.Load() != 2 || b.count(t, "work") != 1 {
		t.Fatalf("calls %d, work rows %d; want 2 calls, 1 row (the cancelled call's write rolled back)", calls.Load(), b.count(t, "work"))
	}
}

// A handler that returns without writing anything: rolled back, 500, nothing stored.
func TestHandlerWritingNothingStoresNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	var calls atomic.Int32
	b.serve(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertWork(t, b, r)
		if calls.Add(1) == 1 {
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if r := b.post(t, "k", "{}"); r.status != http.StatusInternalServerError || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("first: %d %v; want a 500 problem", r.status, r.header)
	}
	if n := b.count(t, "work"); n != 0 {
		t.Fatalf("%d work rows committed by a handler that wrote no answer", n)
	}
	if r := b.post(t, "k", "{}"); r.status != http.StatusCreated || r.header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry: %d %v; want a fresh 201", r.status, r.header)
	}
	// An explicit status with an empty body is a finished answer: stored and replayed.
	if r := b.post(t, "k", "{}"); r.status != http.StatusCreated || r.header.Get(HeaderReplayed) != "true" {
		t.Fatalf("repeat: %d %v; want the stored 201", r.status, r.header)
	}
	if calls.Load() != 2 || b.count(t, "work") != 1 {
		t.Fatalf("calls %d, rows %d", calls.Load(), b.count(t, "work"))
	}
}

// A handler that panics: rolled back, nothing stored, the retry runs it.
func TestPanickingHandlerStoresNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	var calls atomic.Int32
	b.serve(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertWork(t, b, r)
		w.WriteHeader(http.StatusOK)
		if calls.Add(1) == 1 {
			panic(http.ErrAbortHandler) // net/http closes the connection without logging
		}
		_, _ = w.Write([]byte("done"))
	}))
	req, _ := http.NewRequest(http.MethodPost, b.url+"/tasks/score", strings.NewReader("{}"))
	req.Header.Set(HeaderKey, "k")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panicking call answered %d", resp.StatusCode)
	}
	if r := b.post(t, "k", "{}"); r.status != 200 || r.body != "done" || r.header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry after a panic: %d %q %v", r.status, r.body, r.header)
	}
	if calls.Load() != 2 || b.count(t, "work") != 1 {
		t.Fatalf("calls %d, rows %d", calls.Load(), b.count(t, "work"))
	}
}
