// Package httpmw is net/http middleware for the Idempotency-Key request header (IETF httpapi
// draft "The Idempotency-Key HTTP Header Field"), storing responses in PostgreSQL.
//
// For a request with a key the middleware opens a transaction and hands it to the handler
// (Tx(r.Context())). The handler's database work and the stored response (status,
// allow-listed headers, body) commit in that one transaction, so a response is stored if and
// only if the work committed; the client sees the response only after the commit. Then:
//
//   - a repeat with the same key and the same fingerprint (method, request URI, SHA-256 of
//     the body) gets the stored response, with Idempotent-Replayed: true;
//   - a repeat while the first request is still running gets 409 Conflict;
//   - the same key with another fingerprint gets 422 Unprocessable Content;
//   - a missing key gets 400 Bad Request (unless Config.Optional);
//   - a response that is not final (5xx by default, see DefaultFinal) rolls the work back
//     and is not stored, so the client's retry runs the handler again;
//   - only a finished answer is stored: when the request's context ended before the handler
//     returned (the client went away or timed out), when the handler panicked, or when it
//     returned without writing a status or a body, the work is rolled back and nothing is
//     stored, so the client's retry runs the handler again (a handler that wrote nothing
//     gets a 500 answer; a panic goes on to net/http).
//
// The in-flight marker is a transaction-scoped advisory lock on the key
// (pg_try_advisory_xact_lock), held by the first request's open transaction: nothing about
// an unfinished request is ever committed, so a crashed first request leaves no trace and
// blocks nothing once PostgreSQL sees its connection close; Config.InFlightTimeout bounds a
// hung one. Error answers use RFC 9457 problem details (application/problem+json).
package httpmw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// Header names used by the middleware.
const (
	// HeaderKey is the request header carrying the idempotency key (the draft's field).
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on a response replayed from storage.
	HeaderReplayed = "Idempotent-Replayed"
)

// Middleware stores and replays responses for requests carrying an Idempotency-Key.
// Create one with New; it is safe for concurrent use.
type Middleware struct {
	// beforeCommit, set by tests only, runs after the response row is written and before
	// COMMIT (a per-instance test signal).
	beforeCommit func()
	pool         *pgxpool.Pool
	cfg          Config
	log          *zap.Logger

	selectSQL, lockSQL, storeSQL string
	lockPrefix                   string
}

// New returns the middleware for pool. The idempotency_responses table must exist in
// cfg.Schema (kafkatx.Migrate or `kafkatx migrate up` creates it). It opens no connection.
func New(pool *pgxpool.Pool, cfg *Config) (*Middleware, error) {
	if pool == nil {
		return nil, errors.New("httpmw: nil *pgxpool.Pool")
	}
	c := cfg.withDefaults()
	if c.MaxKeyLength > idempotency.MaxKeyBytes {
		return nil, fmt.Errorf("httpmw: Config.MaxKeyLength %d is more than idempotency.MaxKeyBytes (%d)", c.MaxKeyLength, idempotency.MaxKeyBytes)
	}
	t := tables.For(c.Schema).IdempotencyResponses
	m := &Middleware{pool: pool, cfg: c, log: c.Logger}
	m.selectSQL = fmt.Sprintf(`SELECT fingerprint, status, headers, body FROM %s
WHERE scope = $1 AND key = $2 AND expires_at > now()`, t)
	m.lockSQL = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))"
	if c.InFlightTimeout > 0 {
		m.lockSQL = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)), set_config('idle_in_transaction_session_timeout', $2, true)"
	}
	m.storeSQL = fmt.Sprintf(`INSERT INTO %[1]s AS r (scope, key, fingerprint, method, request_uri, status, headers, body, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, COALESCE(now() + $9::bigint * interval '1 microsecond', 'infinity'))
ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, method = EXCLUDED.method,
  request_uri = EXCLUDED.request_uri, status = EXCLUDED.status, headers = EXCLUDED.headers,
  body = EXCLUDED.body, created_at = now(), expires_at = EXCLUDED.expires_at
WHERE r.expires_at <= now()`, t)
	b, _ := json.Marshal([]string{"kafkatx.idempotency.http", c.Schema})
	m.lockPrefix = string(b)
	return m, nil
}

type txKey struct{}
type keyKey struct{}

// Tx returns the transaction the middleware opened for the request whose context is ctx,
// or nil outside the middleware. Do the request's database work in it; do not commit or
// roll it back: the middleware commits it together with the stored response.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// Key returns the request's idempotency key ("" without one).
func Key(ctx context.Context) string {
	k, _ := ctx.Value(keyKey{}).(string)
	return k
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// stored is one response row.
type stored struct {
	fingerprint []byte
	status      int
	headers     map[string][]string
	body        []byte
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if m.cfg.Optional {
			m.runUnkeyed(w, r, next)
			return
		}
		problem(w, http.StatusBadRequest, "This resource requires an Idempotency-Key request header.")
		return
	}
	if len(values) > 1 {
		problem(w, http.StatusBadRequest, "Send one Idempotency-Key header.")
		return
	}
	key, err := parseKey(values[0], m.cfg.MaxKeyLength)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "The request body could not be read.")
		return
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Requests with an Idempotency-Key are limited to %d bytes.", m.cfg.MaxBodyBytes))
		return
	}
	scope := m.cfg.Scope(r)
	if !utf8.ValidString(scope) || bytes.IndexByte([]byte(scope), 0) >= 0 {
		m.log.Error("Config.Scope returned invalid UTF-8 or a NUL byte")
		problem(w, http.StatusInternalServerError, "The request was not completed.")
		return
	}
	if len(scope) > idempotency.MaxScopeBytes {
		// The scope is in the stored responses' primary key, which PostgreSQL bounds.
		m.log.Error("Config.Scope returned more than idempotency.MaxScopeBytes", zap.Int("bytes", len(scope)), zap.Int("max", idempotency.MaxScopeBytes))
		problem(w, http.StatusInternalServerError, "The request was not completed.")
		return
	}
	fp := fingerprint(r, body)
	ctx := r.Context()

	// Fast path: a completed request is replayed without a transaction or a lock.
	if s, err := m.lookup(ctx, m.pool, scope, key); err != nil {
		m.fail(w, "read stored response", err)
		return
	} else if s != nil {
		m.replay(w, s, fp)
		return
	}

	tx, err := m.pool.BeginTx(ctx, m.cfg.TxOptions)
	if err != nil {
		m.fail(w, "begin transaction", err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	lockName, _ := json.Marshal([]string{scope, key})
	args := []any{m.lockPrefix + string(lockName)}
	var locked bool
	var setting *string
	dest := []any{&locked}
	if m.cfg.InFlightTimeout > 0 {
		args = append(args, strconv.FormatInt(m.cfg.InFlightTimeout.Milliseconds(), 10))
		dest = append(dest, &setting)
	}
	if err := tx.QueryRow(ctx, m.lockSQL, args...).Scan(dest...); err != nil {
		m.fail(w, "lock idempotency key", err)
		return
	}
	if !locked {
		inFlight(w)
		return
	}
	// A new statement, so a new snapshot under READ COMMITTED: sees a commit that released
	// the lock just before we took it.
	if s, err := m.lookup(ctx, tx, scope, key); err != nil {
		m.fail(w, "read stored response", err)
		return
	} else if s != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		m.replay(w, s, fp)
		return
	}

	rec := newRecorder()
	hctx := context.WithValue(context.WithValue(ctx, txKey{}, tx), keyKey{}, key)
	r2 := r.WithContext(hctx)
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	next.ServeHTTP(rec, r2) // a panic unwinds past here: the deferred Rollback stores nothing
	if !m.finished(w, rec, ctx) {
		return
	}

	if !m.cfg.Final(rec.status) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		rec.flushTo(w)
		return
	}
	hdrs := map[string][]string{}
	for _, h := range m.cfg.ReplayHeaders {
		if v := rec.header.Values(h); len(v) > 0 {
			hdrs[h] = v
		}
	}
	hj, _ := json.Marshal(hdrs)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	respBody := rec.body.Bytes()
	if respBody == nil {
		respBody = []byte{} // bytea NOT NULL: an empty body is not NULL
	}
	// The headers go as a string with a ::jsonb cast: a []byte argument is bytea to pgx, and in
	// the exec and simple_protocol query modes (a transaction pooler's) it reached the jsonb
	// column as bytea's hex text (docs/deployment.md, "Query exec modes").
	tag, err := tx.Exec(cctx, m.storeSQL, scope, key, fp, r.Method, r.URL.RequestURI(), rec.status, string(hj), respBody,
		m.cfg.retentionMicros())
	if err != nil {
		if conflictCode(err) {
			inFlight(w)
			return
		}
		m.fail(w, "store response", err)
		return
	}
	if tag.RowsAffected() == 0 {
		// Another request stored a response for this key after our check: only possible
		// when two keys' lock names collide in the 64-bit hash, or under REPEATABLE READ.
		inFlight(w)
		return
	}
	if m.beforeCommit != nil {
		m.beforeCommit()
	}
	if err := tx.Commit(cctx); err != nil {
		// The outcome is unknown (a lost COMMIT reply) or the handler left the transaction
		// aborted. Either way the client retries with the same key: it gets the replay if
		// the commit happened, and a fresh run if it did not.
		m.fail(w, "commit", err)
		return
	}
	rec.flushTo(w)
}

// runUnkeyed runs next in a transaction without storing anything (Config.Optional).
func (m *Middleware) runUnkeyed(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx := r.Context()
	tx, err := m.pool.BeginTx(ctx, m.cfg.TxOptions)
	if err != nil {
		m.fail(w, "begin transaction", err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rec := newRecorder()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, txKey{}, tx)))
	if !m.finished(w, rec, ctx) {
		return
	}
	if m.cfg.Final(rec.status) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := tx.Commit(cctx); err != nil {
			m.fail(w, "commit", err)
			return
		}
	}
	rec.flushTo(w)
}

// finished reports whether the handler's answer may be stored and its work committed: the
// request's context is still alive (a handler that saw it end — the client went away or
// timed out — may have stopped half-way and written nothing, or a default 200 with an empty
// body) and the handler wrote a status or a body. Otherwise the caller rolls back and stores
// nothing, so a retry with the same key runs the work; a handler that wrote nothing gets a
// 500 problem answer.
func (m *Middleware) finished(w http.ResponseWriter, rec *recorder, ctx context.Context) bool {
	if err := ctx.Err(); err != nil {
		m.log.Info("request context ended before the handler answered; rolled back, nothing stored",
			zap.NamedError("cause", context.Cause(ctx)))
		if rec.wroteHeader {
			rec.flushTo(w) // the connection may still be open (a server-side deadline)
		}
		return false
	}
	if !rec.wroteHeader {
		m.log.Error("the handler returned without writing a status or a body; rolled back, nothing stored")
		problem(w, http.StatusInternalServerError, "The request was not completed; retry it with the same Idempotency-Key.")
		return false
	}
	return true
}

func (m *Middleware) lookup(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, scope, key string) (*stored, error) {
	var s stored
	var hj []byte
	err := q.QueryRow(ctx, m.selectSQL, scope, key).Scan(&s.fingerprint, &s.status, &hj, &s.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(hj, &s.headers); err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	return &s, nil
}

func (m *Middleware) replay(w http.ResponseWriter, s *stored, fp []byte) {
	if !bytes.Equal(s.fingerprint, fp) {
		problem(w, http.StatusUnprocessableEntity, "This Idempotency-Key was used with a different request (method, URI or body).")
		return
	}
	for k, v := range s.headers {
		w.Header()[k] = v
	}
	w.Header().Set(HeaderReplayed, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.body)))
	w.WriteHeader(s.status)
	_, _ = w.Write(s.body)
}

// fail answers a request the middleware could not complete. When the database's own
// condition stopped it (internal/pgerr's Server class: out of disk or connections, shutting
// down, read-only, the connection lost; docs/failures.md) the answer is 503 with Retry-After,
// so a client waits it out; otherwise 500. Either way the client retries with the same key.
func (m *Middleware) fail(w http.ResponseWriter, what string, err error) {
	cond := pgerr.Describe(err)
	if cond.Class == pgerr.Server {
		m.log.Warn("idempotent request: the database's own condition", zap.String("step", what), zap.Stringer("condition", cond), zap.Error(err))
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "The database is unavailable; retry it with the same Idempotency-Key.")
		return
	}
	m.log.Error("idempotent request", zap.String("step", what), zap.Error(err))
	problem(w, http.StatusInternalServerError, "The request was not completed; retry it with the same Idempotency-Key.")
}

func inFlight(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusConflict, "A request with this Idempotency-Key is still being processed; retry later.")
}

// conflictCode reports an error that means a concurrent request won the key: a unique
// violation (23505) on the stored response's key, or a lost race (internal/pgerr's Conflict
// class: 40001, 40P01, ...).
func conflictCode(err error) bool {
	return pgerr.IsCode(err, "23505") || pgerr.Classify(err) == pgerr.Conflict
}

// fingerprint is SHA-256 over the method, the request URI (path and query, as sent) and
// the body, each length-prefixed so that no two requests share an encoding.
func fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(r.Method), []byte(r.URL.RequestURI()), body} {
		_, _ = fmt.Fprintf(h, "%d:", len(part))
		_, _ = h.Write(part)
	}
	return h.Sum(nil)
}

// problem writes an RFC 9457 problem details response.
func problem(w http.ResponseWriter, status int, detail string) {
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
