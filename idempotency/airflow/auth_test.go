package airflow

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx"
)

// authServer answers like Airflow 3.3.2's api-server with SimpleAuthManager (seen on one):
// POST /auth/token {"username","password"} → 201 {"access_token": JWT}; dagRuns with an
// unknown token → 403 {"detail":"Invalid JWT token"}, with an expired one → 401
// {"detail":"Token Expired"}.
type authServer struct {
	mu        sync.Mutex
	password  string
	lifetime  time.Duration
	issued    map[string]time.Time // token → expiry
	exchanges int
	posts     []string // Authorization of each dagRuns request
	runs      map[string]bool
}

func jwt(exp, iat time.Time, n int) string {
	enc := base64.RawURLEncoding
	claims, _ := json.Marshal(map[string]any{"exp": exp.Unix(), "iat": iat.Unix(), "n": n})
	return enc.EncodeToString([]byte(`{"alg":"HS512"}`)) + "." + enc.EncodeToString(claims) + ".sig"
}

func (s *authServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/auth/token" {
		var in map[string]string
		_ = json.Unmarshal(b, &in)
		if in["username"] != "admin" || in["password"] != s.password {
			w.WriteHeader(401)
			_, _ = w.Write([]byte(`{"detail":"Invalid credentials"}`))
			return
		}
		s.exchanges++
		now := time.Now()
		tok := jwt(now.Add(s.lifetime), now, s.exchanges)
		s.issued[tok] = now.Add(s.lifetime)
		w.WriteHeader(201)
		_ = json.NewEncoder(w).Encode(map[string]string{"access_token": tok})
		return
	}
	auth := r.Header.Get("Authorization")
	s.posts = append(s.posts, auth)
	exp, ok := s.issued[strings.TrimPrefix(auth, "Bearer ")]
	switch {
	case !ok:
		w.WriteHeader(403)
		_, _ = w.Write([]byte(`{"detail":"Invalid JWT token"}`))
	case time.Now().After(exp):
		w.WriteHeader(401)
		_, _ = w.Write([]byte(`{"detail":"Token Expired"}`))
	default:
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		id := fmt.Sprint(body["dag_run_id"])
		if s.runs[id] {
			w.WriteHeader(409)
			return
		}
		s.runs[id] = true
		_, _ = w.Write([]byte(`{"state":"queued"}`))
	}
}

func newAuthServer(t *testing.T, lifetime time.Duration) (*authServer, *httptest.Server, string) {
	s := &authServer{password: "pw-1", lifetime: lifetime, issued: map[string]time.Time{}, runs: map[string]bool{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("pw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s, srv, pwFile
}

func TestUsernamePasswordExchangedAndRefreshedBeforeExpiry(t *testing.T) {
	t.Parallel()
	s, srv, pwFile := newAuthServer(t, 70*time.Second) // refresh due at 56 s (80%), capped at exp-60s = 10 s
	cfg := fastConfig(srv.URL)
	cfg.Username, cfg.PasswordFile = "admin", pwFile
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: fmt.Sprint("k", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if s.exchanges != 1 {
		t.Fatalf("%d token exchanges for 3 runs, want 1 (the token is reused)", s.exchanges)
	}
	exp, refresh := refreshTimes(c.token, time.Now())
	if d := exp.Sub(refresh); d < time.Minute-time.Second || d > time.Minute+time.Second {
		t.Fatalf("refresh %v before expiry, want 1m for a 70 s token", d)
	}
	// Past the refresh time: the next trigger exchanges first, so Airflow never sees a
	// token about to expire.
	c.mu.Lock()
	c.refreshAt = time.Now().Add(-time.Second)
	c.mu.Unlock()
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k3"}); err != nil {
		t.Fatal(err)
	}
	if s.exchanges != 2 || len(s.posts) != 4 {
		t.Fatalf("exchanges %d, posts %d; want 2 exchanges and no refused post", s.exchanges, len(s.posts))
	}
}

func TestExpiredTokenIsReplacedAfter401(t *testing.T) {
	t.Parallel()
	s, srv, pwFile := newAuthServer(t, time.Hour)
	cfg := fastConfig(srv.URL)
	cfg.Username, cfg.PasswordFile = "admin", pwFile
	c, _ := New(cfg)
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	// The server expires the token early (a restarted api-server, a shorter jwt_expiration_time).
	s.mu.Lock()
	for k := range s.issued {
		s.issued[k] = time.Now().Add(-time.Second)
	}
	s.mu.Unlock()
	r, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "b"})
	if err != nil || !r.Created || r.Attempts != 1 {
		t.Fatalf("after an expired token: %+v %v; want the run created in the same attempt", r, err)
	}
	if s.exchanges != 2 {
		t.Fatalf("%d exchanges, want 2", s.exchanges)
	}
}

func TestWrongPasswordIsUnavailableUntilFixed(t *testing.T) {
	t.Parallel()
	s, srv, pwFile := newAuthServer(t, time.Hour)
	s.password = "pw-2" // rotated in Airflow before the file
	cfg := fastConfig(srv.URL)
	cfg.Username, cfg.PasswordFile = "admin", pwFile
	c, _ := New(cfg)
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "a"})
	var se *StatusError
	if !kafkatx.IsUnavailable(err) || !errors.As(err, &se) || se.StatusCode != 401 || se.Endpoint != "/auth/token" {
		t.Fatalf("err %v; want Unavailable wrapping a 401 from /auth/token", err)
	}
	if strings.Contains(err.Error(), "pw-1") {
		t.Fatal("the password is in the error")
	}
	_ = os.WriteFile(pwFile, []byte("pw-2"), 0o600)
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "a"}); err != nil {
		t.Fatalf("after the password file was fixed: %v", err)
	}
}

func TestTokenFileReReadAfter401(t *testing.T) {
	t.Parallel()
	f, srv := newFake(t)
	file := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(file, []byte("old"), 0o600)
	f.fail = func(n int) (int, string) {
		if n == 1 {
			_ = os.WriteFile(file, []byte("new"), 0o600) // rotated while the request was refused
			return 401, ""
		}
		return 0, ""
	}
	cfg := fastConfig(srv.URL)
	cfg.TokenFile = file
	c, _ := New(cfg)
	r, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "a"})
	if err != nil || !r.Created {
		t.Fatalf("%+v %v", r, err)
	}
	if f.requests[0].auth != "Bearer old" || f.requests[1].auth != "Bearer new" {
		t.Fatalf("auth %q then %q", f.requests[0].auth, f.requests[1].auth)
	}
}

func TestAirflowFailuresAreUnavailableAndRequestFailuresAreNot(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{401: true, 403: true, 404: true, 500: true, 503: true, 429: true, 400: false, 422: false} {
		f, srv := newFake(t)
		f.fail = func(int) (int, string) { return status, "0" }
		cfg := fastConfig(srv.URL)
		cfg.MaxAttempts = 2
		c, _ := New(cfg)
		_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != status || kafkatx.IsUnavailable(err) != want {
			t.Errorf("%d: err %v, unavailable %v; want %v", status, err, kafkatx.IsUnavailable(err), want)
		}
	}
	// Nothing listening: connection refused, after the retries.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	c, _ := New(Config{BaseURL: "http://" + addr, MaxAttempts: 2, InitialBackoff: time.Millisecond})
	_, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"})
	if !kafkatx.IsUnavailable(err) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("connection refused: %v", err)
	}
	// A token file that cannot be read is a configuration problem to fix, not the event's.
	c, _ = New(Config{BaseURL: "http://" + addr, TokenFile: filepath.Join(t.TempDir(), "missing")})
	if _, err := c.TriggerDAGRun(context.Background(), Trigger{DAGID: "d", Key: "k"}); !kafkatx.IsUnavailable(err) {
		t.Fatalf("missing token file: %v", err)
	}
	// A cancelled context is neither: the caller is stopping.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "k"}); kafkatx.IsUnavailable(err) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestRunIDNeverRefusedByAirflow(t *testing.T) {
	t.Parallel()
	// Airflow 3.3.2's checks (DagRun.validate_run_id, create_dagrun) for a manual run.
	refused := func(id string) bool {
		if len(id) > MaxRunIDLength || strings.Contains(id, "..") || !allowed(id, true) {
			return true
		}
		for _, p := range reservedRunIDPrefixes {
			if strings.HasPrefix(id, p) {
				return true
			}
		}
		return false
	}
	keys := []string{"pg:app:app..customers:c:1:2", "..", "a..b", ".x", "x.", "ok", strings.Repeat("y", 241), strings.Repeat("y", 242), "a/b", ""}
	for _, prefix := range []string{"", "kafkatx__", "p.", "sched", "x"} {
		for _, k := range keys {
			if id := RunID(prefix, k); refused(id) {
				t.Errorf("RunID(%q, %q) = %q: Airflow refuses it", prefix, k, id)
			}
		}
	}
	// A prefix and key that together spell another run type's prefix are hashed.
	if id := RunID("sched", "uled__2026"); strings.HasPrefix(id, "scheduled__") {
		t.Errorf("reserved prefix produced: %q", id)
	}
	// Ids Airflow accepted before keep their exact form (a redelivered event gets its 409).
	for k, want := range map[string]string{
		"pg:app:app.public.customers:c:24023128:555": "kafkatx__pg:app:app.public.customers:c:24023128:555",
		"pg::app.public.customers:c:100064:701":      "kafkatx__pg::app.public.customers:c:100064:701",
		strings.Repeat("y", 241):                     "kafkatx__" + strings.Repeat("y", 241),
	} {
		if got := RunID("", k); got != want {
			t.Errorf("RunID(%q) = %q, want %q", k, got, want)
		}
	}
	if RunID("", "a..b") == RunID("", "a..c") {
		t.Error("two '..' keys share a run id")
	}
}

func TestRunIDPrefixValidated(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"scheduled__x", "backfill__", "asset_triggered__", "a..b", "with space", "a/b", strings.Repeat("p", MaxRunIDPrefixLength+1)} {
		if _, err := New(Config{BaseURL: "http://x", RunIDPrefix: p}); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
		if id := RunID(p, "k"); !strings.HasPrefix(id, DefaultRunIDPrefix) {
			t.Errorf("RunID with invalid prefix %q gave %q", p, id)
		}
	}
	for _, p := range []string{"manual__", "cdc.", "x~", strings.Repeat("p", MaxRunIDPrefixLength)} {
		if _, err := New(Config{BaseURL: "http://x", RunIDPrefix: p}); err != nil {
			t.Errorf("prefix %q refused: %v", p, err)
		}
		if id := RunID(p, strings.Repeat("/", 10)); len(id) > MaxRunIDLength {
			t.Errorf("prefix %q: %d characters", p, len(id))
		}
	}
}
