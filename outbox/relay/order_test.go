package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// Records with the same key are published in commit order, with two relays running and the
// leader's session killed again and again (each kill hands the leadership over).
//
// Each transaction writes its outbox row first (so row ids follow write order, not commit
// order), then bumps a per-key counter (a row lock: the counter's value is the transaction's
// commit order among the key's writers) and stores that value in the row. Per key, the
// first occurrences of the values on the topic must be 1, 2, 3, ... with none missing; the
// copies a takeover may add are allowed (same outbox id).
func TestSameKeyRecordsArePublishedInCommitOrderWithTwoRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	topic := testenv.Topic(t, b.brokers, 4)
	counters := pgx.Identifier{b.schema, "counters"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+counters+` (k text PRIMARY KEY, n integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const keys, writers, wantKills = 6, 6, 6
	for k := 0; k < keys; k++ {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+counters+` VALUES ($1, 0)`, fmt.Sprintf("key-%d", k)); err != nil {
			t.Fatal(err)
		}
	}
	relays := make([]*Relay, 2)
	for i := range relays {
		pool, err := pgxpool.New(ctx, testenv.DatabaseURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		bb := *b
		bb.pool = pool
		cfg := b.config(t)
		cfg.BatchSize = 50 // several rounds in flight across the kills
		relays[i], _ = bb.start(t, cfg)
	}

	// Kill the leader's session every 300ms, wantKills times; the writers write until then.
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

	var wg sync.WaitGroup
	var total atomic.Int64
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stopWriters:
					return
				default:
				}
				key := fmt.Sprintf("key-%d", rnd.IntN(keys))
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					ids, err := b.w.WriteTx(ctx, tx, outbox.Record{Topic: topic, Key: []byte(key), Value: []byte("?")})
					if err != nil {
						return err
					}
					time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond)
					var n int
					if err := tx.QueryRow(ctx, `UPDATE `+counters+` SET n = n + 1 WHERE k = $1 RETURNING n`, key).Scan(&n); err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `UPDATE `+b.t.Outbox+` SET value = $2 WHERE id = $1`, ids[0], []byte(strconv.Itoa(n)))
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
	waitFor(t, 60*time.Second, "every row published", func() bool {
		var n int64
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE state = 'published'`).Scan(&n)
		return n == total.Load()
	})
	if kills.Load() < wantKills {
		t.Fatalf("only %d leader sessions killed: the test did not exercise takeovers", kills.Load())
	}

	msgs := readAll(t, b.brokers, topic)
	next := map[string]int{}
	seenID := map[string]bool{}
	dups := 0
	for _, m := range msgs {
		id, _ := header(m, outbox.HeaderOutboxID)
		if seenID[id] {
			dups++
			continue
		}
		seenID[id] = true
		n, err := strconv.Atoi(string(m.Value))
		if err != nil {
			t.Fatalf("value %q", m.Value)
		}
		k := string(m.Key)
		if n != next[k]+1 {
			t.Fatalf("key %s: commit #%d published after #%d (partition %d offset %d)", k, n, next[k], m.TopicPartition.Partition, m.TopicPartition.Offset)
		}
		next[k] = n
	}
	if int64(len(seenID)) != total.Load() {
		t.Fatalf("%d distinct outbox ids on the topic, want %d", len(seenID), total.Load())
	}
	published := relays[0].Stats().Published + relays[1].Stats().Published
	t.Logf("%d records, %d leader sessions killed, %d copies from takeovers; published by relay 1: %d, relay 2: %d (sum %d)",
		total.Load(), kills.Load(), dups, relays[0].Stats().Published, relays[1].Stats().Published, published)
}
