package relay

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// writePacked writes records in one transaction as packed rows and returns their ids.
func (b *testBundle) writePacked(t testing.TB, recs ...outbox.Record) []int64 {
	t.Helper()
	w := b.w
	w.Pack = true
	var ids []int64
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = w.WriteTx(context.Background(), tx, recs...)
		return err
	})
	if err != nil {
		t.Fatalf("write packed outbox rows: %v", err)
	}
	return ids
}

// openRows counts the outbox rows by state, and the outbox_commits rows.
func (b *testBundle) openRows(t testing.TB) (map[string]int, int) {
	t.Helper()
	out := map[string]int{}
	rows, err := b.pool.Query(context.Background(), `SELECT state, count(*)::int FROM `+b.t.Outbox+` GROUP BY state`)
	if err != nil {
		t.Fatal(err)
	}
	var st string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { out[st] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	var commits int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*)::int FROM `+b.t.OutboxCommits).Scan(&commits); err != nil {
		t.Fatal(err)
	}
	return out, commits
}

// Packed rows, rows of one record and plain-SQL rows, mixed in and across transactions,
// publish each record once, keys in write order (one writer: commit order is write order),
// and leave nothing behind: no pack, no row, no outbox_commits row.
func TestPackedAndPlainRowsPublishOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	cfg := b.config(t)
	cfg.KeepPublished = 0
	cfg.BatchSize = 70 // packs cut across rounds
	r, _ := b.start(t, cfg)
	const keys, txs = 5, 30
	seq := make([]int, keys)
	next := func(k int) outbox.Record {
		seq[k]++
		return outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", k)), Value: []byte(fmt.Sprintf("k%d-%d", k, seq[k]))}
	}
	want := 0
	ctx := context.Background()
	packed := b.w
	packed.Pack = true
	for tx := 0; tx < txs; tx++ {
		err := pgx.BeginFunc(ctx, b.pool, func(dbtx pgx.Tx) error {
			for part := 0; part < 3; part++ {
				var recs []outbox.Record
				for i := 0; i < 5+tx%7; i++ {
					recs = append(recs, next((tx+part+i)%keys))
				}
				want += len(recs)
				w := b.w
				if (tx+part)%2 == 0 {
					w = packed
				}
				if _, err := w.WriteTx(ctx, dbtx, recs...); err != nil {
					return err
				}
				rec := next(tx % keys) // and a row by plain SQL
				want++
				if _, err := dbtx.Exec(ctx, `INSERT INTO `+b.t.Outbox+` (topic, key, value) VALUES ($1, $2, $3)`, rec.Topic, rec.Key, rec.Value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var packs int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE state = 'packed'`).Scan(&packs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records, %d packed rows written", want, packs)
	waitCount(t, b.brokers, topic, int64(want), 90*time.Second)
	waitFor(t, 30*time.Second, "the outbox empty", func() bool {
		open, commits := b.openRows(t)
		return len(open) == 0 && commits == 0
	})
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range readAll(t, b.brokers, topic) {
		v := string(m.Value)
		if seen[v] {
			t.Errorf("%s published twice", v)
		}
		seen[v] = true
		var k, n int
		if _, err := fmt.Sscanf(v, "k%d-%d", &k, &n); err != nil {
			t.Fatalf("value %q: %v", v, err)
		}
		if key := string(m.Key); n != last[key]+1 {
			t.Errorf("key %s: %s after %d", key, v, last[key])
		}
		last[string(m.Key)] = n
		if _, ok := header(m, outbox.HeaderOutboxID); !ok {
			t.Errorf("%s has no %s header", v, outbox.HeaderOutboxID)
		}
	}
	if len(seen) != want {
		t.Fatalf("%d distinct records published, want %d", len(seen), want)
	}
	if s := r.Stats(); s.Published != int64(want) {
		t.Errorf("Stats().Published = %d, want %d (records, not rows)", s.Published, want)
	}
}

// A record of a pack that the broker refuses for good is parked alone, as a plain row under
// its own id: its row-mates of other keys are published, the later records of its key wait
// behind it (as plain pending rows), and discarding it lets them go.
func TestPackedBadRecordParksAloneAndDiscardFreesItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "4000"})
	cfg := b.config(t)
	cfg.KeepPublished = 0
	r, _ := b.start(t, cfg)
	big := bytes.Repeat([]byte("x"), 8000)
	var recs []outbox.Record
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("a1")})
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: big})
	for i := 0; i < 5; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte("b"), Value: []byte{'b', byte('1' + i)}})
	}
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("a3")})
	recs = append(recs, outbox.Record{Topic: topic, Value: []byte("nil key")})
	ids := b.writePacked(t, recs...)
	bigID, a3 := ids[1], ids[7]

	waitFor(t, 60*time.Second, "the large record parked and the others published", func() bool {
		st := b.states(t)
		return st[bigID] == "parked" && topicCount(t, b.brokers, topic) == 7
	})
	time.Sleep(time.Second) // rounds in which a3 could wrongly be published
	st := b.states(t)
	if len(st) != 2 || st[a3] != "pending" {
		t.Fatalf("outbox rows %v; want only %d parked and %d (a3) pending", st, bigID, a3)
	}
	parked, err := b.w.Parked(context.Background(), b.pool, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != bigID || parked[0].Waiting != 1 ||
		!strings.Contains(strings.ToLower(parked[0].LastError), "too large") {
		t.Fatalf("Parked() = %+v, %v; want the large record with 1 record waiting and a size error", parked, err)
	}
	if n, _, err := r.Backlog(context.Background()); err != nil || n != 0 {
		t.Fatalf("Backlog = %d, %v; want 0", n, err)
	}
	var values []string
	for _, m := range readAll(t, b.brokers, topic) {
		values = append(values, string(m.Value))
	}
	if got := strings.Join(values, ","); got != "a1,b1,b2,b3,b4,b5,nil key" {
		t.Fatalf("published %s, want a1,b1,b2,b3,b4,b5,nil key", got)
	}
	// The parked record keeps its outbox id (the one its pack gave it).
	if oid := b.outboxIDs(t)[bigID]; oid == "" {
		t.Fatal("the parked row has no outbox_id")
	}
	err = pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.DiscardTx(context.Background(), tx, bigID, "too large for the topic", "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(t, b.brokers, topic, 8, 60*time.Second)
	if m := readAll(t, b.brokers, topic); string(m[len(m)-1].Value) != "a3" {
		t.Fatalf("last record %q, want a3", m[len(m)-1].Value)
	}
}

// A record of a pack over the producer's message.max.bytes is parked alone; released once a
// relay with a larger limit runs, it is published, and then the record of its key behind it.
func TestPackedParkedRecordReleased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.Kafka["message.max.bytes"] = 10000
	_, stop := b.start(t, cfg)
	ids := b.writePacked(t,
		outbox.Record{Topic: topic, Key: []byte("k"), Value: bytes.Repeat([]byte("y"), 20000)},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("after")},
		outbox.Record{Topic: topic, Key: []byte("other"), Value: []byte("flows")},
	)
	waitFor(t, 60*time.Second, "parked and published", func() bool {
		return b.states(t)[ids[0]] == "parked" && topicCount(t, b.brokers, topic) == 1
	})
	stop()
	if st := b.states(t)[ids[1]]; st != "pending" {
		t.Fatalf("the record behind the parked one is %s, want pending", st)
	}
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.ReleaseTx(context.Background(), tx, ids[0], "limit raised", "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, b.config(t))
	waitCount(t, b.brokers, topic, 3, 60*time.Second)
	var values []string
	for _, m := range readAll(t, b.brokers, topic) {
		if len(m.Value) > 100 {
			values = append(values, "big")
			continue
		}
		values = append(values, string(m.Value))
	}
	if got := strings.Join(values, ","); got != "flows,big,after" {
		t.Fatalf("published %s, want flows,big,after", got)
	}
}

// WaitBelow and Backlog count the records of packed rows, not the rows.
func TestPackedRecordsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	var recs []outbox.Record
	for i := 0; i < 30; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 4)), Value: []byte("v")})
	}
	b.writePacked(t, recs...)
	b.write(t, recs[:5]...)
	r, err := New(b.pool, b.config(t))
	if err != nil {
		t.Fatal(err)
	}
	if n, _, err := r.Backlog(context.Background()); err != nil || n != 35 {
		t.Fatalf("Backlog = %d, %v; want 35", n, err)
	}
	if p, err := r.Pending(context.Background()); err != nil || !p {
		t.Fatalf("Pending = %v, %v; want true", p, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := b.w.WaitBelow(b.pool, 34)(ctx); err == nil {
		t.Fatal("WaitBelow(34) returned with 35 records pending")
	}
	if err := b.w.WaitBelow(b.pool, 35)(context.Background()); err != nil {
		t.Fatalf("WaitBelow(35): %v", err)
	}
}

// A relay SIGKILLed after the broker acknowledged a pack's records and before it marked the
// pack (hang-before-mark), or inside the mark's transaction (stop-in-mark), loses none of
// them: the pack is still there, and the next relay publishes each record again under the
// same kafkatx-outbox-id, key and value. Each record is on the topic once, plus once more for
// each the killed relay had delivered.
func TestPackedKilledRelayRepublishesWithSameIDs(t *testing.T) {
	testenv.FullTier(t, "starts and SIGKILLs relay processes")
	for _, mode := range []string{"hang-before-mark", "stop-in-mark"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			topic := testenv.Topic(t, b.brokers, 3)
			const n = 1500 // two packs
			var recs []outbox.Record
			for i := 0; i < n; i++ {
				recs = append(recs, outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%17)), Value: []byte(fmt.Sprintf("v%d", i))})
			}
			b.writePacked(t, recs...)

			c := b.startChild(t, mode)
			delivered := -1
			if mode == "hang-before-mark" {
				line := c.expect(t, "DELIVERED ", 60*time.Second)
				if _, err := fmt.Sscanf(line, "DELIVERED %d", &delivered); err != nil || delivered == 0 {
					t.Fatalf("child said %q", line)
				}
			} else {
				c.expect(t, "IN MARK", 60*time.Second)
			}
			c.kill(t)
			open, _ := b.openRows(t)
			if open["packed"] != 2 || len(open) != 1 {
				t.Fatalf("outbox rows by state after the kill: %v; want the 2 packs, untouched", open)
			}
			onTopic := topicCount(t, b.brokers, topic)
			if delivered >= 0 && onTopic != int64(delivered) {
				t.Fatalf("topic holds %d records after the kill, child reported %d delivered", onTopic, delivered)
			}
			r, _ := b.start(t, b.config(t))
			waitFor(t, 60*time.Second, "every record published by the second relay", func() bool { return r.Stats().Published == n })
			msgs := readAll(t, b.brokers, topic)
			if int64(len(msgs)) != n+onTopic {
				t.Fatalf("topic holds %d records, want %d + %d copies", len(msgs), n, onTopic)
			}
			type rec struct{ key, value string }
			first := map[string]rec{}
			copies := map[string]int{}
			for _, m := range msgs {
				id, ok := header(m, outbox.HeaderOutboxID)
				if !ok {
					t.Fatalf("record without %s", outbox.HeaderOutboxID)
				}
				copies[id]++
				if f, seen := first[id]; seen && (f.key != string(m.Key) || f.value != string(m.Value)) {
					t.Fatalf("outbox id %s published as %v and as %q/%q", id, f, m.Key, m.Value)
				}
				first[id] = rec{string(m.Key), string(m.Value)}
			}
			twice := 0
			for _, c := range copies {
				if c == 2 {
					twice++
				} else if c != 1 {
					t.Fatalf("a record published %d times", c)
				}
			}
			if len(copies) != n || int64(twice) != onTopic {
				t.Fatalf("%d distinct records, %d twice; want %d, %d", len(copies), twice, n, onTopic)
			}
			t.Logf("%s: the killed relay had published %d of %d records; each record is on the topic, %d twice with the same id", mode, onTopic, n, twice)
		})
	}
}

// Published packs kept by KeepPublished are removed by retention like published rows.
func TestPublishedPacksRemovedByRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.KeepPublished = time.Millisecond
	// The test runs the janitor's pass itself (r.Clean): the periodic pass's first runs when
	// leadership is taken, and under load it ran after the publish and removed the pack before
	// the check that it is kept as published (CI: 0 published rows).
	cfg.Janitor.Disabled = true
	r, stop := b.start(t, cfg)
	var recs []outbox.Record
	for i := 0; i < 20; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")})
	}
	b.writePacked(t, recs...)
	waitFor(t, 30*time.Second, "published", func() bool { return r.Stats().Published == 20 })
	stop()
	var published, count int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(pack_count), 0) FROM `+b.t.Outbox+` WHERE state = 'published'`).Scan(&published, &count); err != nil {
		t.Fatal(err)
	}
	if published != 1 || count != 20 {
		t.Fatalf("%d published rows holding %d records; want the pack, 20", published, count)
	}
	time.Sleep(10 * time.Millisecond)
	if err := r.Clean(context.Background()); err != nil {
		t.Fatal(err)
	}
	if open, commits := b.openRows(t); len(open) != 0 || commits != 0 {
		t.Fatalf("after retention: rows %v, %d outbox_commits rows; want none", open, commits)
	}
}

// Relays before migration 015 read state = 'pending' only (the fetch, Pending, the mode
// switch's check): a packed row is not one to them, so such a relay leaves it alone — it never
// publishes a pack as one record and never deletes it. Writers pack only once every relay
// reads packs (docs/upgrading.md).
func TestPacksAreNotPendingRowsToOlderRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	b.writePacked(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}, outbox.Record{Topic: topic, Value: []byte("w")})
	var pending, packed int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'packed') FROM `+b.t.Outbox).Scan(&pending, &packed); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || packed != 1 {
		t.Fatalf("%d pending and %d packed rows; want 0 and 1", pending, packed)
	}
	// The previous version's delete of delivered rows (by id, state = 'pending') cannot take it.
	tag, err := b.pool.Exec(context.Background(), `DELETE FROM `+b.t.Outbox+` WHERE state = 'pending'`)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("delete pending: %v, %v", tag, err)
	}
}

// The commit-order trigger locks a pack's keys as it locks plain rows' keys (the lock per-key
// commit order rests on), and past 512 keyed records takes the one exclusive commit lock.
// SET CONSTRAINTS ALL IMMEDIATE runs the deferred trigger before the commit, so the
// transaction's advisory locks can be read.
func TestPackKeysAreLockedAtCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	packed := b.w
	packed.Pack = true
	locks := func(recs []outbox.Record) (keyLocks, commitLocks int) {
		t.Helper()
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := packed.WriteTx(ctx, tx, recs...); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE l.classid::bigint = hashtext('kafkatx.outbox.keys.' || $1)::bigint & 4294967295),
				count(*) FILTER (WHERE l.classid::bigint = hashtext('kafkatx.outbox.commit.' || $1)::bigint & 4294967295 AND l.mode = 'ExclusiveLock')
				FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted`, b.schema).Scan(&keyLocks, &commitLocks)
		})
		if err != nil {
			t.Fatal(err)
		}
		return keyLocks, commitLocks
	}
	var recs []outbox.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, outbox.Record{Topic: "t", Key: []byte(fmt.Sprintf("k%d", i%4)), Value: []byte("v")})
	}
	recs = append(recs, outbox.Record{Topic: "t", Value: []byte("no key")})
	if k, c := locks(recs); k != 4 || c != 0 {
		t.Fatalf("a pack of 4 keys took %d key locks and %d exclusive commit locks; want 4 and 0", k, c)
	}
	recs = recs[:0]
	for i := 0; i < 600; i++ {
		recs = append(recs, outbox.Record{Topic: "t", Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v")})
	}
	if k, c := locks(recs); k != 0 || c != 1 {
		t.Fatalf("a pack of 600 keyed records took %d key locks and %d exclusive commit locks; want 0 and 1", k, c)
	}
}
