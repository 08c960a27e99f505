// Package kafkatxtest tests a kafkatx Handler or BatchHandler without Kafka: it runs the
// handler over messages you build, the way the consumer loop would, inside a PostgreSQL
// transaction that is rolled back when the test ends, and reports per message what the loop
// would have done — committed, skipped as a duplicate, retried (an attempt), dead-lettered,
// waited for an unavailable dependency, or run again after a retryable database error.
//
// The rules are the loop's own code (its transaction body, internal/engine.Body), not a copy:
// a panic is recovered as an attempt with its stack; Permanent(err) dead-letters at once;
// FailMessage names the failing message of a batch and the others are re-run without it; a
// batch that fails without naming a message is re-run one message per transaction; an
// ordinary failure at Message.Attempt < Config.Retry.MaxAttempts is an attempt (the loop
// would try again after a backoff), at MaxAttempts a dead letter — the handler's own timeout,
// cancellation or network error included; Unavailable, PostgreSQL errors that are not the
// message's (docs/failures.md) and the transaction's connection lost roll back without an attempt; the
// handler's tx refuses Commit and Rollback (kafkatx.ErrTxOwnedByLoop); business
// idempotency keys (Config.Idempotency) are claimed and a key claimed before skips its
// message. Dead letters are written in the transaction as the loop writes them (the
// dead_letters row and, unless Config.DeadLetter.Disabled, its outbox record for the
// dead-letter topic), so Tx.DeadLetters and Tx.Outbox show what the loop would commit.
//
// Each New gets a fresh schema with kafkatx's migrations applied, dropped when the test ends,
// so tests run in parallel against one server. Give New nothing, and the kit connects to
// DATABASE_URL with the test's schema first on the search_path, so your service's own tables,
// created through Kit.Pool with unqualified names, land in it too; give it your own
// *pgxpool.Pool (Options.Pool), and the search_path stays yours: qualify your tables with
// Kit.Schema. Either way the code under test must write kafkatx's tables in Kit.Schema — pass
// outbox.Writer{Schema: k.Schema()}, not outbox.Writer{} (Tx.Outbox fails the test on records
// written to the default "kafkatx" schema).
//
// For a whole loop — a real Consumer over Kafka's protocol — without a JVM, see package
// kafkatxtest/kafkatxbroker.
package kafkatxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// EnvDatabaseURL names the environment variable New connects to when Options.Pool is nil: a
// PostgreSQL URL or keyword/value string whose role may create schemas.
const EnvDatabaseURL = "DATABASE_URL"

// DefaultGroup is Options.Group's default.
const DefaultGroup = "kafkatxtest"

// Options configures New. A nil *Options means all defaults.
type Options struct {
	// Pool connects to PostgreSQL; its role must be able to create a schema. The kit does not
	// close it, nor change its search_path: an unqualified CREATE TABLE through it lands where
	// the pool's search_path says (usually public) and outlives the test, so qualify your
	// tables with Kit.Schema (pgx.Identifier{k.Schema(), "orders"}.Sanitize()). Defaults to a
	// pool on DATABASE_URL (closed when the test ends) whose search_path is the test's schema,
	// then public.
	Pool *pgxpool.Pool

	// Config supplies the loop's rules: Retry.MaxAttempts, Idempotency, DeadLetter, Park
	// (a message to be retried, and its key's later messages, are Parked), Prepare
	// (run before each try, as the loop runs it before each transaction) and Middleware (applied around the handler as the loop applies it, kafkatx.Chain). Kafka,
	// Topics, Schema and the loop's other settings are ignored (the schema is the kit's).
	// Defaults to nil: the defaults of kafkatx.Config (5 attempts, business keys from the
	// kafkatx-outbox-id header, dead letters published to "<topic>.dlq").
	Config *kafkatx.Config

	// Group is the consumer group id stored in dead letters and in the scope of claimed
	// idempotency keys ("<group>/0"). Defaults to DefaultGroup.
	Group string

	// TopicIDs maps a topic to the topic id (KIP-516) of its log, as the loop reads it from
	// the broker: the outbox ids of the records a handler writes for a message of that topic
	// are derived from it as the loop derives them ("<group>/0/<topic id>"; see
	// kafkatx.Message.OutboxSource). A topic without one is scoped "<group>/0", as the loop
	// scopes a log whose topic id the broker does not give. Defaults to none.
	TopicIDs map[string]string
}

// Kit runs handlers against one test's schema. Create one with New; it is bound to that test.
type Kit struct {
	t          testing.TB
	pool       *pgxpool.Pool
	schema     string
	group      string
	topicIDs   map[string]string
	maxAttempt int
	idem       kafkatx.IdempotencyConfig
	middleware []kafkatx.Middleware
	dlqTopic   func(string) string // nil: dead letters kept in the database only
	prepare    func(context.Context, []*kafkatx.Message) error
	park       bool // Config.Park.Enabled
}

// New creates a fresh schema named "kafkatxtest_<16 hex digits>", applies kafkatx's migrations
// to it (kafkatx.Migrate), and registers its DROP SCHEMA ... CASCADE with t.Cleanup. Without
// Options.Pool and with DATABASE_URL unset, it skips the test with the reason, or fails it
// when the CI environment variable is set (to anything but "", "0" or "false"); a database
// that does not answer within 10 s, or a failed migration, fails the test.
func New(t testing.TB, opts *Options) *Kit {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	k := &Kit{t: t, pool: opts.Pool, schema: "kafkatxtest_" + hex.EncodeToString(b[:]), group: opts.Group}
	if k.group == "" {
		k.group = DefaultGroup
	}
	k.topicIDs = maps.Clone(opts.TopicIDs)
	var cfg kafkatx.Config
	if opts.Config != nil {
		cfg = *opts.Config
	}
	cfg = cfg.WithDefaults() // the loop's own defaults, applied in one place
	k.maxAttempt = cfg.Retry.MaxAttempts
	k.idem = cfg.Idempotency
	k.middleware = cfg.Middleware
	k.prepare = cfg.Prepare
	k.park = cfg.Park.Enabled
	if !cfg.DeadLetter.Disabled {
		k.dlqTopic = cfg.DeadLetter.Topic
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if k.pool == nil {
		k.pool = connect(ctx, t, k.schema)
	}
	quoted := tables.For(k.schema).QuotedSchema
	if _, err := k.pool.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		t.Fatalf("kafkatxtest: create schema %s: %v", k.schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := k.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE"); err != nil {
			t.Errorf("kafkatxtest: drop schema %s: %v", k.schema, err)
		}
	})
	if err := kafkatx.Migrate(ctx, k.pool, k.schema); err != nil {
		t.Fatalf("kafkatxtest: %v", err)
	}
	return k
}

// connect opens a pool on DATABASE_URL with schema first on the search_path; its Close is
// registered with t.Cleanup before the schema's DROP, so it runs after it.
func connect(ctx context.Context, t testing.TB, schema string) *pgxpool.Pool {
	t.Helper()
	dsn := os.Getenv(EnvDatabaseURL)
	if dsn == "" {
		unavailable(t, "%s is not set", EnvDatabaseURL)
	}
	cfg, err := pg.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("kafkatxtest: parse %s: %v", EnvDatabaseURL, err) // pgx's error names no password
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = tables.For(schema).QuotedSchema + ", public"
	cfg.MaxConns = 16 // each open Tx holds one
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(pctx, cfg)
	if err == nil {
		if err = pool.Ping(pctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		t.Fatalf("kafkatxtest: PostgreSQL at %s@%s:%d (%s) does not answer: %v", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, EnvDatabaseURL, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if v := strings.ToLower(strings.TrimSpace(os.Getenv("CI"))); v != "" && v != "0" && v != "false" {
		t.Fatalf("kafkatxtest: %s (CI is set, so this fails instead of skipping)", reason)
	}
	t.Skipf("kafkatxtest: SKIPPED: %s; set it to a PostgreSQL URL whose role may create schemas", reason)
}

// Pool returns the kit's pool: Options.Pool (its own search_path: qualify tables with Schema),
// or the one on DATABASE_URL whose search_path starts with Schema — create your service's
// tables through it.
func (k *Kit) Pool() *pgxpool.Pool { return k.pool }

// Schema returns the test's schema (unquoted), which holds kafkatx's tables: pass it to
// outbox.Writer{Schema: ...} and the like in the code under test.
func (k *Kit) Schema() string { return k.schema }
