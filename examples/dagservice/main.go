// Command dagservice is kafkatx's example of an internal HTTP service called by Airflow tasks.
// It serves POST /tasks/{name} with a JSON body and answers 200 with a JSON result, behind
// the Idempotency-Key middleware (package idempotency/httpmw), which it requires: the task's
// database write and the stored response commit in one transaction, so a task retried by
// Airflow with the same key, {dag_id}/{run_id}/{task_id}/{map_index}, gets the first answer
// back (Idempotent-Replayed: true) and writes nothing twice.
//
// Usage: dagservice --addr HOST:PORT --database-url URL. Its contract is in docs/examples.md.
// Logs go to stderr.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/examples/internal/service"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/idempotency/httpmw"
	"github.com/kafkatx/kafkatx/pg"
)

func main() {
	flag.CommandLine = flag.NewFlagSet("dagservice", flag.ContinueOnError)
	addr := flag.String("addr", "127.0.0.1:8090", "HOST:PORT to listen on")
	dbURL := flag.String("database-url", "", "PostgreSQL URL, postgres://user:pass@host:port/db (default $DATABASE_URL); through a transaction pooler (PgBouncer) pgx runs without prepared statements")
	sessionURL := flag.String("session-database-url", "", "PostgreSQL URL for the migrations' session-level lock, reaching PostgreSQL directly or through a session pooler (default --database-url): set it when --database-url goes through a transaction pooler")
	schema := flag.String("schema", pg.DefaultSchema, "schema of kafkatx's tables")
	retention := flag.Duration("retention", 24*time.Hour, "how long a response is replayed for its Idempotency-Key")
	taskDelay := flag.Duration("task-delay", 0, "time each task takes (to try a repeat while the first call runs: 409)")
	if code, ok := flagcheck.Parse(flag.CommandLine, os.Args[1:]); !ok {
		os.Exit(code)
	}
	if *dbURL == "" { // read after parsing, so --help never prints a password
		*dbURL = os.Getenv("DATABASE_URL")
	}
	if err := flagcheck.First(
		flagcheck.Duration("retention", *retention, time.Minute, 365*24*time.Hour),
		flagcheck.Duration("task-delay", *taskDelay, 0, time.Hour),
		flagcheck.Addr("addr", *addr),
		flagcheck.Schema("schema", *schema),
		flagcheck.DatabaseURL("database-url", *dbURL),
		flagcheck.DatabaseURL("session-database-url", *sessionURL),
	); err != nil {
		fmt.Fprintln(os.Stderr, "dagservice:", err)
		os.Exit(2)
	}

	log := service.Logger() // JSON on stderr at $KAFKATX_LOG_LEVEL
	defer log.Sync()        //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, *addr, *dbURL, *sessionURL, *schema, *retention, *taskDelay, log); err != nil {
		fmt.Fprintln(os.Stderr, "dagservice:", service.SessionRefusal(err))
		os.Exit(1)
	}
}

const schemaSQL = `
CREATE TABLE IF NOT EXISTS task_results (
    id              bigserial   PRIMARY KEY,
    idempotency_key text        NOT NULL,
    task            text        NOT NULL,
    input           jsonb       NOT NULL,
    score           integer     NOT NULL,
    computed_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS task_results_key_idx ON task_results (idempotency_key);`

func serve(ctx context.Context, addr, dbURL, sessionURL, schema string, retention, taskDelay time.Duration, log *zap.Logger) error {
	if dbURL == "" {
		return errors.New("no database: pass --database-url postgres://user:pass@host:port/db or set DATABASE_URL")
	}
	// Through a transaction pooler the pool runs pgx's QueryExecModeExec (pg.ParsePoolConfig);
	// the migrations take a session-level lock on the session pool.
	pools, err := (&service.Flags{DatabaseURL: dbURL, SessionDatabaseURL: sessionURL}).OpenPools(ctx, log)
	if err != nil {
		return err
	}
	defer pools.Close()
	pool := pools.Pool
	if err := kafkatx.Migrate(ctx, pools.Session, schema); err != nil {
		return err
	}
	if err := migrate(ctx, pools.Session); err != nil {
		return err
	}
	mw, err := httpmw.New(pool, &httpmw.Config{Schema: schema, Retention: retention, Logger: log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /tasks/{name}", mw.Handler(&tasks{delay: taskDelay}))
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	janitor := idempotency.NewJanitor(pool, &idempotency.JanitorConfig{Schema: schema, Logger: log})
	jctx, jcancel := context.WithCancel(ctx)
	jdone := make(chan error, 1)
	go func() { jdone <- janitor.Run(jctx) }()
	defer func() { jcancel(); <-jdone }()

	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("dagservice listening", zap.String("addr", addr))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	// Serialize concurrent starts: CREATE TABLE IF NOT EXISTS races on the catalog.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('kafkatx.example.dagservice'))"); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext('kafkatx.example.dagservice'))") //nolint:errcheck
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// tasks computes a task's result and records it in the request's transaction.
type tasks struct {
	delay time.Duration
}

type result struct {
	Task       string          `json:"task"`
	Key        string          `json:"idempotency_key"`
	Input      json.RawMessage `json:"input"`
	Score      int             `json:"score"`
	ComputedAt time.Time       `json:"computed_at"`
}

func (t *tasks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(r.Body)
	if err != nil || !json.Valid(body) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the body must be JSON"})
		return
	}
	if t.delay > 0 {
		select {
		case <-time.After(t.delay):
		case <-ctx.Done():
			// The caller went away (its process killed, a timeout): give up with a 503, which
			// the middleware neither stores nor commits, so the caller's retry runs the task.
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the request ended before the task finished"})
			return
		}
	}
	sum := sha256.Sum256(body)
	res := result{
		Task:  r.PathValue("name"),
		Key:   httpmw.Key(ctx),
		Input: body,
		Score: int(binary.BigEndian.Uint32(sum[:4]) % 1000),
	}
	// The task's own write: in the middleware's transaction, with the stored response. The
	// JSON goes as a string cast to jsonb: a []byte is bytea to pgx, which in the exec and
	// simple_protocol query modes (PgBouncer's) reaches a jsonb column as hex text.
	err = httpmw.Tx(ctx).QueryRow(ctx,
		`INSERT INTO task_results (idempotency_key, task, input, score) VALUES ($1, $2, $3::jsonb, $4) RETURNING computed_at`,
		res.Key, res.Task, string(body), res.Score).Scan(&res.ComputedAt)
	if err != nil {
		if ctx.Err() != nil {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the request ended before the task finished"})
			return
		}
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "record the result"})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
