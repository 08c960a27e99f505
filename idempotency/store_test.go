package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pg"
)

type testBundle struct {
	pool   *pgxpool.Pool
	schema string
	store  idempotency.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(context.Background(), pool, schema); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &testBundle{pool: pool, schema: schema, store: idempotency.Store{Schema: schema}}
}

// claimIn claims key in a fresh transaction and commits it (or rolls it back).
func (b *testBundle) claimIn(t *testing.T, scope, key string, commit bool) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	first, err := b.store.ClaimTx(ctx, tx, scope, key)
	if err != nil {
		t.Fatalf("claim %q: %v", key, err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return first
}

func TestClaimFirstThenDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a failed test must not hold the connection
	first, err := b.store.ClaimTx(ctx, tx, "g", "k1")
	if err != nil || !first {
		t.Fatalf("first claim = %v, %v; want true", first, err)
	}
	again, err := b.store.ClaimTx(ctx, tx, "g", "k1")
	if err != nil || again {
		t.Fatalf("second claim in the same transaction = %v, %v; want false", again, err)
	}
	if done, _ := b.store.Done(ctx, b.pool, "g", "k1"); done {
		t.Fatal("an uncommitted claim is visible to other transactions")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := b.store.Done(ctx, b.pool, "g", "k1"); err != nil || !done {
		t.Fatalf("Done after commit = %v, %v; want true", done, err)
	}
	if b.claimIn(t, "g", "k1", true) {
		t.Fatal("a committed key was claimed again")
	}
	if !b.claimIn(t, "other-scope", "k1", true) {
		t.Fatal("the same key in another scope was not first")
	}
	if existed, err := b.store.Forget(ctx, b.pool, "g", "k1"); err != nil || !existed {
		t.Fatalf("Forget = %v, %v", existed, err)
	}
	if !b.claimIn(t, "g", "k1", true) {
		t.Fatal("a forgotten key was not first")
	}
}

func TestClaimRolledBackIsForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if !b.claimIn(t, "g", "k", false) {
		t.Fatal("first claim not first")
	}
	if !b.claimIn(t, "g", "k", true) {
		t.Fatal("a claim whose transaction rolled back still counts")
	}
}

func TestClaimAnyBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "a\x00b\xff\xfe" // NUL and invalid UTF-8, as a Kafka header may hold
	if !b.claimIn(t, "g", key, true) || b.claimIn(t, "g", key, true) {
		t.Fatal("binary key not claimed exactly once")
	}
	if !b.claimIn(t, "g", "a\x00b\xff", true) {
		t.Fatal("a prefix of a binary key collided with it")
	}
	ctx := context.Background()
	tx, _ := b.pool.Begin(ctx)
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := b.store.ClaimTx(ctx, tx, "g", ""); !errors.Is(err, idempotency.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := b.store.ClaimTx(ctx, tx, "bad\xff", "k"); err == nil {
		t.Fatal("invalid UTF-8 scope accepted")
	}
}

// TestClaimWaitsForConcurrentTransaction: a second transaction claiming a key held by an
// open transaction waits for it, then sees its outcome.
func TestClaimWaitsForConcurrentTransaction(t *testing.T) {
	t.Parallel()
	testenv.Postgres(t) // the parent skips too when PostgreSQL is missing, not only its subtests
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "first commits", false: "first rolls back"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			tx1, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback(ctx) //nolint:errcheck
			if first, err := b.store.ClaimTx(ctx, tx1, "g", "k"); err != nil || !first {
				t.Fatalf("claim 1 = %v, %v", first, err)
			}
			type res struct {
				first bool
				err   error
			}
			got := make(chan res, 1)
			go func() {
				tx2, err := b.pool.Begin(ctx)
				if err != nil {
					got <- res{err: err}
					return
				}
				defer tx2.Rollback(ctx) //nolint:errcheck
				f, err := b.store.ClaimTx(ctx, tx2, "g", "k")
				if err == nil {
					err = tx2.Commit(ctx)
				}
				got <- res{f, err}
			}()
			select {
			case r := <-got:
				t.Fatalf("second claim returned %+v while the first transaction was open", r)
			case <-time.After(300 * time.Millisecond):
			}
			if commit {
				err = tx1.Commit(ctx)
			} else {
				err = tx1.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.first == commit {
				t.Fatalf("second claim first=%v after the first transaction %s", r.first, name)
			}
		})
	}
}

// TestClaimRace: many transactions race for one key; exactly one is first.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var firsts atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				f, err := b.store.ClaimTx(ctx, tx, "g", "hot")
				if f {
					firsts.Add(1)
					time.Sleep(20 * time.Millisecond) // hold the row while others queue
				}
				return err
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := firsts.Load(); n != 1 {
		t.Fatalf("%d transactions were first, want 1", n)
	}
}

// TestClaimSerializable: under SERIALIZABLE a concurrent claim fails with 40001 rather than
// returning a wrong answer.
func TestClaimSerializable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	tx1, _ := b.pool.BeginTx(ctx, opts)
	defer tx1.Rollback(ctx) //nolint:errcheck
	tx2, _ := b.pool.BeginTx(ctx, opts)
	defer tx2.Rollback(ctx) //nolint:errcheck
	// Take both snapshots before either claim.
	for _, tx := range []pgx.Tx{tx1, tx2} {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	if f, err := b.store.ClaimTx(ctx, tx1, "g", "k"); err != nil || !f {
		t.Fatalf("claim 1: %v %v", f, err)
	}
	errc := make(chan error, 1)
	go func() { _, err := b.store.ClaimTx(ctx, tx2, "g", "k"); errc <- err }()
	time.Sleep(100 * time.Millisecond)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("concurrent serializable claim: %v, want SQLSTATE 40001", err)
	}
}

func TestClaimExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	claim := func(ttl time.Duration) bool {
		var first bool
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
			first, err = idempotency.Store{Schema: b.schema, Retention: ttl}.ClaimTx(ctx, tx, "g", "k")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return first
	}
	if !claim(time.Hour) {
		t.Fatal("first claim not first")
	}
	if claim(time.Hour) {
		t.Fatal("claim within the retention was first")
	}
	keys := pgx.Identifier{b.schema, "idempotency_keys"}.Sanitize()
	var inAnHour bool
	if err := b.pool.QueryRow(ctx, "SELECT expires_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' FROM "+keys).Scan(&inAnHour); err != nil || !inAnHour {
		t.Fatalf("a key claimed with a 1 h retention does not expire in an hour (%v)", err)
	}
	// Let the retention pass without sleeping: a load spike must not decide the test.
	if _, err := b.pool.Exec(ctx, "UPDATE "+keys+" SET expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if !claim(pg.KeepForever) { // expired: taken over, now kept forever
		t.Fatal("claim after expiry was not first")
	}
	if claim(time.Hour) {
		t.Fatal("a key claimed with pg.KeepForever expired")
	}
	var exp string
	if err := b.pool.QueryRow(ctx, "SELECT expires_at::text FROM "+keys).Scan(&exp); err != nil || exp != "infinity" {
		t.Fatalf("expires_at = %q, %v; want infinity", exp, err)
	}
}
