package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// TestSameKeyRecordsArePublishedInCommitOrderWithTwoRelays with packed rows: each transaction
// writes a pack (its key's record and a nil-key record) first, then bumps a per-key counter
// (its commit order among the key's writers) and stores the record's counter value in a
// table of its own (a pack's value cannot be updated). Per key, the first occurrences on the
// topic must be counters 1, 2, 3, ... with none missing, with two relays running and the
// leader's session killed again and again. (The counter's row lock orders the writers of one
// key by itself; that a pack's keys are locked at commit, which orders writers that share
// nothing else, is TestPackKeysAreLockedAtCommit.)
func TestPackedSameKeyRecordsArePublishedInCommitOrderWithTwoRelays(t *testing.T) {
	testenv.FullTier(t, "concurrent writers and repeated leader kills for a few seconds")
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	topic := testenv.Topic(t, b.brokers, 4)
	counters := pgx.Identifier{b.schema, "counters"}.Sanitize()
	order := pgx.Identifier{b.schema, "commit_order"}.Sanitize()
	for _, q := range []string{`CREATE TABLE ` + counters + ` (k text PRIMARY KEY, n integer NOT NULL)`,
		`CREATE TABLE ` + order + ` (v text PRIMARY KEY, n integer NOT NULL)`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const keys, writers, wantKills = 6, 6, 6
	for k := 0; k < keys; k++ {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+counters+` VALUES ($1, 0)`, fmt.Sprintf("key-%d", k)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		pool, err := pgxpool.New(ctx, testenv.DatabaseURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		bb := *b
		bb.pool = pool
		cfg := b.config(t)
		cfg.BatchSize = 50
		cfg.KeepPublished = 0
		bb.start(t, cfg)
	}
	stopWriters := make(chan struct{})
	var kills atomic.Int64
	var killerDone sync.WaitGroup
	killerDone.Add(1)
	go func() {
		defer killerDone.Done()
		defer close(stopWriters)
		for tries := 0; kills.Load() < wantKills && tries < 100; tries++ {
			time.Sleep(300 * time.Millisecond)
			tag, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
				  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('kafkatx.relay.' || $1, 0)`, b.schema)
			if err == nil && tag.RowsAffected() > 0 {
				kills.Add(1)
			}
		}
	}()
	packed := b.w
	packed.Pack = true
	var wg sync.WaitGroup
	var total atomic.Int64
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			for i := 0; ; i++ {
				select {
				case <-stopWriters:
					return
				default:
				}
				key, v := fmt.Sprintf("key-%d", rnd.IntN(keys)), fmt.Sprintf("w%d-%d", w, i)
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					if _, err := packed.WriteTx(ctx, tx, outbox.Record{Topic: topic, Key: []byte(key), Value: []byte(v)},
						outbox.Record{Topic: topic, Value: []byte("filler")}); err != nil {
						return err
					}
					time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond)
					var n int
					if err := tx.QueryRow(ctx, `UPDATE `+counters+` SET n = n + 1 WHERE k = $1 RETURNING n`, key).Scan(&n); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+order+` VALUES ($1, $2)`, v, n)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				total.Add(1)
				time.Sleep(time.Duration(rnd.IntN(10)) * time.Millisecond)
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	killerDone.Wait()
	if kills.Load() < wantKills {
		t.Fatalf("only %d leader sessions killed: the test did not exercise takeovers", kills.Load())
	}
	waitFor(t, 60*time.Second, "every pack published", func() bool {
		open, _ := b.openRows(t)
		return len(open) == 0
	})
	nOf := map[string]int{}
	rows, err := b.pool.Query(ctx, `SELECT v, n FROM `+order)
	if err != nil {
		t.Fatal(err)
	}
	var v string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&v, &n}, func() error { nOf[v] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	seen := map[string]bool{}
	dups := 0
	for _, m := range readAll(t, b.brokers, topic) {
		if m.Key == nil {
			continue
		}
		id, _ := header(m, outbox.HeaderOutboxID)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		n, ok := nOf[string(m.Value)]
		if !ok {
			t.Fatalf("value %q has no commit number", m.Value)
		}
		k := string(m.Key)
		if n != next[k]+1 {
			t.Fatalf("key %s: commit #%d published after #%d", k, n, next[k])
		}
		next[k] = n
	}
	if int64(len(seen)) != total.Load() {
		t.Fatalf("%d distinct keyed records on the topic, want %d", len(seen), total.Load())
	}
	t.Logf("%d packs, %d leader sessions killed, %d copies from takeovers", total.Load(), kills.Load(), dups)
}
