package httpmw

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Environment of the helper process started by the crash tests.
const (
	envHelper   = "HTTPMW_TEST_HELPER" // "kill-before-commit" or "block"
	envHelperDB = "HTTPMW_TEST_DATABASE_URL"
	envSchema   = "HTTPMW_TEST_SCHEMA"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		helperMain(mode)
		return
	}
	os.Exit(m.Run())
}

type testBundle struct {
	pool   *pgxpool.Pool
	schema string
	url    string
	calls  atomic.Int32
}

// workHandler records one row in <schema>.work through the middleware's transaction and
// answers JSON, with one allow-listed header (Location) and one that is not (X-Trace).
func workHandler(schema string, calls *atomic.Int32, status func(n int32) int) http.HandlerFunc {
	table := pgx.Identifier{schema, "work"}.Sanitize()
	return func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		tx := Tx(r.Context())
		if _, err := tx.Exec(r.Context(), "INSERT INTO "+table+" (key, body) VALUES ($1, $2)", Key(r.Context()), string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/work/"+Key(r.Context()))
		w.Header().Set("X-Trace", fmt.Sprint(n))
		w.WriteHeader(status(n))
		_ = json.NewEncoder(w).Encode(map[string]any{"call": n, "at": time.Now().UnixNano()})
	}
}

func always(code int) func(int32) int { return func(int32) int { return code } }

func newBundle(t *testing.T, pool *pgxpool.Pool) *testBundle {
	t.Helper()
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "work"}.Sanitize()+" (key text, body text)"); err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, schema: schema}
}

// setup serves h (nil: workHandler answering 200) behind the middleware configured by cfg.
func setup(t *testing.T, cfg *Config, h http.Handler) *testBundle {
	t.Helper()
	b := newBundle(t, testenv.Postgres(t))
	b.serve(t, cfg, h)
	return b
}

func (b *testBundle) serve(t *testing.T, cfg *Config, h http.Handler) {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	cfg.Schema = b.schema
	mw, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = workHandler(b.schema, &b.calls, always(http.StatusOK))
	}
	srv := httptest.NewServer(mw.Handler(h))
	t.Cleanup(srv.Close)
	b.url = srv.URL
}

type response struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, method, url string, keys []string, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		req.Header.Add(HeaderKey, k)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func (b *testBundle) post(t *testing.T, key, body string) response {
	t.Helper()
	var keys []string
	if key != "" {
		keys = []string{key}
	}
	return do(t, http.MethodPost, b.url+"/tasks/score", keys, body)
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{b.schema, table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFirstRunThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	r1 := b.post(t, "d/r1/t/0", `{"customer":1}`)
	if r1.status != 200 || r1.header.Get(HeaderReplayed) != "" || r1.header.Get("X-Trace") != "1" {
		t.Fatalf("first: %d %v", r1.status, r1.header)
	}
	r2 := b.post(t, "d/r1/t/0", `{"customer":1}`)
	if r2.status != 200 || r2.body != r1.body || r2.header.Get(HeaderReplayed) != "true" {
		t.Fatalf("repeat: %d %q %v; want the stored response marked replayed", r2.status, r2.body, r2.header)
	}
	if r2.header.Get("Location") != "/work/d/r1/t/0" || r2.header.Get("Content-Type") != "application/json" {
		t.Fatalf("allow-listed headers not replayed: %v", r2.header)
	}
	if r2.header.Get("X-Trace") != "" {
		t.Fatalf("a header outside the allow-list was replayed: %v", r2.header)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := b.count(t, "work"); n != 1 {
		t.Fatalf("%d work rows, want 1", n)
	}
	// RFC 8941 sf-string form of the same key.
	if r3 := b.post(t, `"d/r1/t/0"`, `{"customer":1}`); r3.header.Get(HeaderReplayed) != "true" || r3.body != r1.body {
		t.Fatalf("quoted key not treated as the same key: %d %v", r3.status, r3.header)
	}
	// Another key runs the handler.
	if r4 := b.post(t, "d/r1/t/1", `{"customer":1}`); r4.status != 200 || r4.header.Get(HeaderReplayed) != "" || b.calls.Load() != 2 {
		t.Fatalf("another key: %d %v calls=%d", r4.status, r4.header, b.calls.Load())
	}
}

func TestScopesSeparateClients(t *testing.T) {
	t.Parallel()
	b := setup(t, &Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Client") }}, nil)
	send := func(client string) response {
		req, _ := http.NewRequest(http.MethodPost, b.url+"/x", strings.NewReader("{}"))
		req.Header.Set(HeaderKey, "same")
		req.Header.Set("X-Client", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return response{status: resp.StatusCode, header: resp.Header}
	}
	if r := send("a"); r.header.Get(HeaderReplayed) != "" {
		t.Fatal("first call of client a replayed")
	}
	if r := send("b"); r.header.Get(HeaderReplayed) != "" {
		t.Fatal("client b got client a's response")
	}
	if r := send("a"); r.header.Get(HeaderReplayed) != "true" {
		t.Fatal("client a's repeat not replayed")
	}
}

func TestConcurrentRepeatGets409(t *testing.T) {
	t.Parallel()
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var b *testBundle
	b = setup(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		workHandler(b.schema, &b.calls, always(200))(w, r)
	}))
	first := make(chan response, 1)
	go func() { first <- b.post(t, "k", `{"a":1}`) }()
	<-entered
	for range 3 {
		r := b.post(t, "k", `{"a":1}`)
		if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
			t.Fatalf("repeat while in flight: %d %v %s; want 409 problem with Retry-After", r.status, r.header, r.body)
		}
	}
	// A different body while in flight is also 409: the stored fingerprint does not exist yet.
	if r := b.post(t, "k", `{"a":2}`); r.status != http.StatusConflict {
		t.Fatalf("other body while in flight: %d", r.status)
	}
	close(release)
	r1 := <-first
	if r1.status != 200 {
		t.Fatalf("first: %d %s", r1.status, r1.body)
	}
	if r := b.post(t, "k", `{"a":1}`); r.body != r1.body || r.header.Get(HeaderReplayed) != "true" {
		t.Fatalf("after completion: %d %v", r.status, r.header)
	}
	if b.calls.Load() != 1 || b.count(t, "work") != 1 {
		t.Fatalf("handler ran %d times, %d rows; want 1", b.calls.Load(), b.count(t, "work"))
	}
}

func TestReusedKeyWithOtherRequestGets422(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	if r := b.post(t, "k", `{"customer":1}`); r.status != 200 {
		t.Fatal(r.status)
	}
	for name, r := range map[string]response{
		"other body":   b.post(t, "k", `{"customer":2}`),
		"other path":   do(t, http.MethodPost, b.url+"/tasks/other", []string{"k"}, `{"customer":1}`),
		"other query":  do(t, http.MethodPost, b.url+"/tasks/score?x=1", []string{"k"}, `{"customer":1}`),
		"other method": do(t, http.MethodPut, b.url+"/tasks/score", []string{"k"}, `{"customer":1}`),
	} {
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
			t.Errorf("%s: %d %s; want 422 problem", name, r.status, r.body)
		}
	}
	if b.calls.Load() != 1 {
		t.Fatalf("handler ran %d times", b.calls.Load())
	}
}

func TestBadKeysGet400(t *testing.T) {
	t.Parallel()
	b := setup(t, &Config{MaxKeyLength: 16}, nil)
	for name, keys := range map[string][]string{
		"missing":      nil,
		"repeated":     {"a", "b"},
		"too long":     {strings.Repeat("x", 17)},
		"non-ascii":    {"ключ"},
		"unterminated": {`"abc`},
		"empty quoted": {`""`},
		"after quoted": {`"abc" x`},
		"bad escape":   {`"a\b"`},
	} {
		r := do(t, http.MethodPost, b.url+"/x", keys, "{}")
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, r.status)
		}
	}
	if b.calls.Load() != 0 {
		t.Fatalf("handler ran %d times for bad keys", b.calls.Load())
	}
}

func TestOptionalKey(t *testing.T) {
	t.Parallel()
	b := setup(t, &Config{Optional: true}, nil)
	for range 2 {
		if r := b.post(t, "", `{}`); r.status != 200 || r.header.Get(HeaderReplayed) != "" {
			t.Fatalf("no key: %d %v", r.status, r.header)
		}
	}
	if b.calls.Load() != 2 || b.count(t, "work") != 2 || b.count(t, "idempotency_responses") != 0 {
		t.Fatalf("calls=%d rows=%d stored=%d; want 2, 2 committed, nothing stored", b.calls.Load(), b.count(t, "work"), b.count(t, "idempotency_responses"))
	}
}

// TestServerErrorNotStored: a 5xx rolls the handler's work back and is not stored, so the
// retry runs the handler again; its success is then stored.
func TestServerErrorNotStored(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	b.serve(t, nil, workHandler(b.schema, &b.calls, func(n int32) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusCreated
	}))
	if r := b.post(t, "k", "{}"); r.status != http.StatusServiceUnavailable || r.header.Get("X-Trace") != "1" {
		t.Fatalf("first: %d %v", r.status, r.header)
	}
	if n := b.count(t, "work"); n != 0 {
		t.Fatalf("the 503's work committed: %d rows", n)
	}
	r2 := b.post(t, "k", "{}")
	if r2.status != http.StatusCreated || r2.header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry after 503: %d %v; want a fresh run", r2.status, r2.header)
	}
	r3 := b.post(t, "k", "{}")
	if r3.status != http.StatusCreated || r3.header.Get(HeaderReplayed) != "true" || r3.body != r2.body {
		t.Fatalf("repeat: %d %v", r3.status, r3.header)
	}
	if b.calls.Load() != 2 || b.count(t, "work") != 1 {
		t.Fatalf("calls=%d rows=%d; want 2 calls, 1 row", b.calls.Load(), b.count(t, "work"))
	}
}

// TestClientErrorStored: a 4xx is the final answer and is replayed, its work committed.
func TestClientErrorStored(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	b.serve(t, nil, workHandler(b.schema, &b.calls, always(http.StatusNotFound)))
	r1 := b.post(t, "k", "{}")
	r2 := b.post(t, "k", "{}")
	if r1.status != 404 || r2.status != 404 || r2.header.Get(HeaderReplayed) != "true" || r2.body != r1.body || b.calls.Load() != 1 {
		t.Fatalf("404 not replayed: %d %d %v calls=%d", r1.status, r2.status, r2.header, b.calls.Load())
	}
}

// TestAbortedTransactionNotStored: a handler whose SQL failed but which answers 200 anyway
// gets a 500 from the middleware (the commit fails) and nothing is stored.
func TestAbortedTransactionNotStored(t *testing.T) {
	t.Parallel()
	var b *testBundle
	b = setup(t, &Config{Logger: zaptest.NewLogger(t)}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := b.calls.Add(1)
		if n == 1 {
			_, _ = Tx(r.Context()).Exec(r.Context(), "SELECT * FROM no_such_table")
		}
		w.WriteHeader(200)
	}))
	if r := b.post(t, "k", "{}"); r.status != 500 {
		t.Fatalf("first: %d, want 500", r.status)
	}
	if b.count(t, "idempotency_responses") != 0 {
		t.Fatal("a response was stored for an aborted transaction")
	}
	if r := b.post(t, "k", "{}"); r.status != 200 || r.header.Get(HeaderReplayed) != "" || b.calls.Load() != 2 {
		t.Fatalf("retry: %d %v calls=%d", r.status, r.header, b.calls.Load())
	}
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, &Config{MaxBodyBytes: 10}, nil)
	if r := b.post(t, "k", strings.Repeat("x", 11)); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d, want 413", r.status)
	}
	if r := b.post(t, "k", "0123456789"); r.status != 200 {
		t.Fatalf("%d at the limit", r.status)
	}
}

// TestRetention: once a response has expired the key is free again, even with another body.
func TestRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, &Config{Retention: 200 * time.Millisecond}, nil)
	if r := b.post(t, "k", `{"v":1}`); r.status != 200 {
		t.Fatal(r.status)
	}
	if r := b.post(t, "k", `{"v":2}`); r.status != 422 {
		t.Fatalf("within retention: %d, want 422", r.status)
	}
	time.Sleep(400 * time.Millisecond)
	if r := b.post(t, "k", `{"v":2}`); r.status != 200 || r.header.Get(HeaderReplayed) != "" {
		t.Fatalf("after retention: %d %v; want a fresh run", r.status, r.header)
	}
	if r := b.post(t, "k", `{"v":2}`); r.header.Get(HeaderReplayed) != "true" {
		t.Fatalf("the new response was not stored: %v", r.header)
	}
}

// startHelper runs this test binary as a server process in mode, on b's database and schema,
// and returns it with its base URL. Lines it prints after the address are sent on lines.
func startHelper(t *testing.T, b *testBundle, mode string) (*exec.Cmd, string, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envHelper+"="+mode, envHelperDB+"="+testenv.DatabaseURL(t), envSchema+"="+b.schema)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 10)
	sc := bufio.NewScanner(out)
	go func() {
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		addr, ok := strings.CutPrefix(l, "addr ")
		if !ok {
			t.Fatalf("helper said %q", l)
		}
		return cmd, "http://" + addr, lines
	case <-time.After(20 * time.Second):
		t.Fatal("helper did not start")
	}
	return nil, "", nil
}

// TestKillBeforeCommit: the process dies (SIGKILL) after the handler's work and the response
// row are written and before COMMIT: neither exists afterwards, and the key is free, so the
// client's retry runs the handler and its answer is then stored.
func TestKillBeforeCommit(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	cmd, url, _ := startHelper(t, b, "kill-before-commit")
	req, _ := http.NewRequest(http.MethodPost, url+"/tasks/score", strings.NewReader(`{"customer":1}`))
	req.Header.Set(HeaderKey, "d/r/t/0")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the helper answered %d; it should have died before committing", resp.StatusCode)
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want SIGKILL", err)
	}
	if w, s := b.count(t, "work"), b.count(t, "idempotency_responses"); w != 0 || s != 0 {
		t.Fatalf("after the kill: %d work rows, %d stored responses; want neither", w, s)
	}
	b.serve(t, nil, nil)
	start := time.Now()
	var r response
	for {
		r = b.post(t, "d/r/t/0", `{"customer":1}`)
		if r.status != http.StatusConflict || time.Since(start) > 10*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond) // PostgreSQL has not yet noticed the closed connection
	}
	if r.status != 200 || r.header.Get(HeaderReplayed) != "" {
		t.Fatalf("retry after the kill: %d %v; want a fresh 200", r.status, r.header)
	}
	t.Logf("key free %v after the kill", time.Since(start).Round(time.Millisecond))
	if r2 := b.post(t, "d/r/t/0", `{"customer":1}`); r2.header.Get(HeaderReplayed) != "true" || r2.body != r.body {
		t.Fatalf("repeat: %d %v", r2.status, r2.header)
	}
	if w := b.count(t, "work"); w != 1 {
		t.Fatalf("%d work rows, want 1", w)
	}
}

// TestKillInFlightReleasesKey: while another process runs the first request, a repeat here
// gets 409; once that process is SIGKILLed the key is free again.
func TestKillInFlightReleasesKey(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	cmd, url, lines := startHelper(t, b, "block")
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url+"/tasks/score", strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, "k")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case l := <-lines:
		if l != "in handler" {
			t.Fatalf("helper said %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("helper's handler did not start")
	}
	b.serve(t, nil, nil)
	if r := b.post(t, "k", `{}`); r.status != http.StatusConflict {
		t.Fatalf("repeat while another process runs the first: %d, want 409", r.status)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = cmd.Wait()
	var r response
	for {
		r = b.post(t, "k", `{}`)
		if r.status != http.StatusConflict || time.Since(killed) > 10*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.status != 200 {
		t.Fatalf("after the kill: %d, want 200", r.status)
	}
	t.Logf("key free %v after the kill", time.Since(killed).Round(time.Millisecond))
	if b.count(t, "work") != 1 {
		t.Fatalf("%d work rows, want 1", b.count(t, "work"))
	}
}

// helperMain serves the middleware for the crash tests and prints "addr HOST:PORT".
func helperMain(mode string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envHelperDB))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	schema := os.Getenv(envSchema)
	mw, err := New(pool, &Config{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var calls atomic.Int32
	h := workHandler(schema, &calls, always(200))
	switch mode {
	case "kill-before-commit":
		mw.beforeCommit = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	case "block":
		inner := h
		h = func(w http.ResponseWriter, r *http.Request) {
			inner(w, r) // the work row is written in the open transaction
			fmt.Println("in handler")
			time.Sleep(time.Hour)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("addr " + ln.Addr().String())
	_ = http.Serve(ln, mw.Handler(h))
}

// Issue 48: the scope and the key are the stored responses' primary key, which PostgreSQL
// bounds (about 2,700 bytes an entry). New refuses a MaxKeyLength over
// idempotency.MaxKeyBytes, and a scope over idempotency.MaxScopeBytes is refused (500) before
// the handler runs, instead of failing the store after the handler's work.
func TestScopeAndKeyBoundedByThePrimaryKey(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.Postgres(t))
	if _, err := New(b.pool, &Config{Schema: b.schema, MaxKeyLength: 5000}); err == nil || !strings.Contains(err.Error(), "MaxKeyBytes") {
		t.Fatalf("New with MaxKeyLength 5000: %v, want an error naming idempotency.MaxKeyBytes", err)
	}
	long := strings.Repeat("s", 3000)
	b.serve(t, &Config{Scope: func(*http.Request) string { return long }}, nil)
	if r := b.post(t, "k", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("a 3,000-byte scope answered %d, want 500", r.status)
	}
	if n := b.calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for a scope that cannot be stored, want 0", n)
	}
}
