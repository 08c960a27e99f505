package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

type testBundle struct {
	pool    *pgxpool.Pool
	schema  string
	t       tables.Names
	commits string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, schema: schema, t: tables.For(schema), commits: pgx.Identifier{schema, "outbox_commits"}.Sanitize()}
}

// Write stores records byte for byte in the caller's transaction, returns ids in order, and
// writes nothing if the transaction rolls back.
func TestWriteStoresRecordsInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	p := int32(3)
	recs := []outbox.Record{
		{Topic: "t1", Key: nil, Value: []byte{0, 0xff}, Headers: []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: nil}}},
		{Topic: "t2", Key: []byte{}, Value: nil, Partition: &p},
		{Topic: "t1", Key: []byte("k"), Value: []byte("v"), Headers: []outbox.Header{{Key: "c", Value: []byte{0}}}},
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = w.WriteTx(ctx, tx, recs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || !(ids[0] < ids[1] && ids[1] < ids[2]) {
		t.Fatalf("ids %v, want 3 ascending", ids)
	}
	for i, id := range ids {
		var topic, state string
		var key, value []byte
		var hk, hv [][]byte
		var part *int32
		var seq *int64
		err := b.pool.QueryRow(ctx, `SELECT o.topic, o.key, o.value, o.header_keys, o.header_values, o.partition, o.state, c.commit_seq
			FROM `+b.t.Outbox+` o LEFT JOIN `+b.commits+` c USING (txid) WHERE o.id = $1`, id).
			Scan(&topic, &key, &value, &hk, &hv, &part, &state, &seq)
		if err != nil {
			t.Fatal(err)
		}
		r := recs[i]
		if topic != r.Topic || (key == nil) != (r.Key == nil) || !bytes.Equal(key, r.Key) || (value == nil) != (r.Value == nil) || !bytes.Equal(value, r.Value) {
			t.Errorf("row %d: %s %v %v, want %+v", i, topic, key, value, r)
		}
		if len(hk) != len(r.Headers) {
			t.Errorf("row %d: %d headers, want %d", i, len(hk), len(r.Headers))
		}
		for j, h := range r.Headers {
			if j < len(hk) && (string(hk[j]) != h.Key || !bytes.Equal(hv[j], h.Value) || hv[j] == nil) {
				t.Errorf("row %d header %d: %q=%v, want %q=%v (non-nil)", i, j, hk[j], hv[j], h.Key, h.Value)
			}
		}
		if (part == nil) != (r.Partition == nil) || (part != nil && *part != *r.Partition) {
			t.Errorf("row %d partition %v", i, part)
		}
		if state != "pending" || seq == nil {
			t.Errorf("row %d: state %s, commit_seq %v; want pending with a commit sequence", i, state, seq)
		}
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTx(ctx, tx, outbox.Record{Topic: "rolled-back", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE topic = 'rolled-back'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rolled-back record stored: %d, %v", n, err)
	}

	neg := int32(-1)
	for _, bad := range []outbox.Record{{Topic: "", Value: []byte("x")}, {Topic: "t", Partition: &neg}} {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, bad); return err })
		if err == nil {
			t.Errorf("Write(%+v) succeeded", bad)
		}
	}
}

// Rows of one key get their commit sequence in commit order, even when the transaction with
// the lower id commits last; a transaction's rows share one sequence number.
func TestCommitSequenceFollowsCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	first, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx) //nolint:errcheck
	lowIDs, err := w.WriteTx(ctx, first, outbox.Record{Topic: "t", Key: []byte("k"), Value: []byte("low id, commits last")},
		outbox.Record{Topic: "t", Key: []byte("j"), Value: []byte("same transaction")})
	if err != nil {
		t.Fatal(err)
	}
	var highIDs []int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		highIDs, err = w.WriteTx(ctx, tx, outbox.Record{Topic: "t", Key: []byte("k"), Value: []byte("high id, commits first")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	seq := func(id int64) int64 {
		var s int64
		if err := b.pool.QueryRow(ctx, `SELECT c.commit_seq FROM `+b.t.Outbox+` o JOIN `+b.commits+` c USING (txid) WHERE o.id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if !(seq(highIDs[0]) < seq(lowIDs[0])) {
		t.Fatalf("commit_seq of the first commit %d, of the later commit %d: want the first lower", seq(highIDs[0]), seq(lowIDs[0]))
	}
	if seq(lowIDs[0]) != seq(lowIDs[1]) {
		t.Fatalf("rows of one transaction have commit_seq %d and %d", seq(lowIDs[0]), seq(lowIDs[1]))
	}

	// A transaction with many keys takes the commit lock once instead of one lock per key.
	recs := make([]outbox.Record, 200)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "t", Key: []byte{byte(i), 1}, Value: []byte("x")}
	}
	var many []int64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { many, err = w.WriteTx(ctx, tx, recs...); return err })
	if err != nil {
		t.Fatal(err)
	}
	if seq(many[0]) != seq(many[199]) || seq(many[0]) <= seq(lowIDs[0]) {
		t.Fatalf("big transaction's commit_seq %d..%d", seq(many[0]), seq(many[199]))
	}
}

// A writer of key k waits at commit while another transaction holds k's commit lock (taken
// when its rows are sequenced, held until its commit is visible), so it gets the higher
// sequence number; a writer of another key is not held up.
func TestConcurrentSameKeyCommitsAreSerialized(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	// Hold key k's commit lock the way outbox_sequence does, in a transaction that stays open.
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := w.WriteTx(ctx, holder, outbox.Record{Topic: "t", Key: []byte("k"), Value: []byte("holder")}); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil { // sequences now, lock held until commit
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := w.WriteTx(ctx, tx, outbox.Record{Topic: "t", Key: []byte("k"), Value: []byte("waiter")})
			return err
		})
	}()
	select {
	case err := <-done:
		t.Fatalf("second writer of key k committed while the first held the key (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	// Another key is not held up.
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := w.WriteTx(ctx, tx, outbox.Record{Topic: "t", Key: []byte("other"), Value: []byte("free")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var order []string
	rows, _ := b.pool.Query(ctx, `SELECT convert_from(o.value, 'UTF8') FROM `+b.t.Outbox+` o JOIN `+b.commits+` c USING (txid)
		WHERE o.key = 'k' ORDER BY c.commit_seq, o.id`)
	order, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || strings.Join(order, ",") != "holder,waiter" {
		t.Fatalf("order %v, %v", order, err)
	}
}

// A plain SQL insert of (topic, key, value) is a complete row.
func TestPlainSQLInsertNeedsOnlyTopicKeyValue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{outbox.Channel(b.schema)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.t.Outbox+` (topic, key, value) VALUES ('t', 'k1'::bytea, 'v'::bytea), ('t', NULL, 'w'::bytea)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` o JOIN `+b.commits+` c USING (txid)
		WHERE o.state = 'pending' AND c.commit_seq IS NOT NULL AND o.outbox_id IS NOT NULL`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d complete pending rows, %v; want 2", n, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no NOTIFY on %s: %v", outbox.Channel(b.schema), err)
	}
	wctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if _, err := conn.Conn().WaitForNotification(wctx2); err == nil {
		t.Fatal("a second NOTIFY for one transaction")
	}
}

// The package builds without cgo: services that only write to the outbox need no librdkafka.
func TestOutboxBuildsWithoutCgo(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "github.com/kafkatx/kafkatx/outbox")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "confluent-kafka-go") {
		t.Fatalf("package outbox depends on confluent-kafka-go:\n%s", out)
	}
}

// Past 512 keyed rows a transaction takes the exclusive commit lock (without hashing its
// keys): while it is being committed no other outbox writer can take a commit number, and it
// waits for a committer of a few keys that holds the shared lock. 512 keyed rows still lock
// their keys one by one.
func TestManyKeyedRowsCommitAloneAmongOutboxWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	rows := func(n int, prefix string) []outbox.Record {
		recs := make([]outbox.Record, n)
		for i := range recs {
			recs[i] = outbox.Record{Topic: "t", Key: []byte(fmt.Sprintf("%s-%d", prefix, i)), Value: []byte("x")}
		}
		return recs
	}
	// hold writes recs and sequences them now; the locks stay until the returned tx ends.
	hold := func(recs []outbox.Record) pgx.Tx {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := w.WriteTx(ctx, tx, recs...); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	commitsWithin := func(recs []outbox.Record, d time.Duration) (chan error, bool) {
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := w.WriteTx(ctx, tx, recs...); return err })
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return nil, true
		case <-time.After(d):
			return done, false
		}
	}

	big := hold(rows(513, "big"))
	waiting, ok := commitsWithin(rows(1, "other"), 500*time.Millisecond)
	if ok {
		t.Fatal("a writer of an unrelated key committed while a 513-row transaction held the exclusive commit lock")
	}
	if err := big.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}

	small := hold(rows(1, "small"))
	waiting, ok = commitsWithin(rows(600, "many"), 500*time.Millisecond)
	if ok {
		t.Fatal("a 600-row transaction committed while another outbox writer held the shared commit lock")
	}
	if err := small.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}

	// 512 keyed rows: per-key locks, so a writer of an unrelated key is not held up.
	perKey := hold(rows(512, "perkey"))
	if _, ok := commitsWithin(rows(1, "free"), 10*time.Second); !ok {
		t.Fatal("a writer of an unrelated key waited for a 512-row transaction")
	}
	if err := perKey.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Write of many records without headers or partitions goes through COPY: the rows must be
// the same as INSERT writes them — ids ascending in record order, nil and empty keys and
// values kept apart, a distinct version-4 outbox_id, created_at by the database clock, the
// writing transaction's txid and a commit sequence — and a rollback must leave none.
func TestWriteManyRecordsByCopyStoresTheSameRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outbox.Writer{Schema: b.schema}
	const n = 1500 // at least copyMinRecords
	recs := make([]outbox.Record, n)
	for i := range recs {
		recs[i] = outbox.Record{Topic: fmt.Sprintf("t%d", i%3), Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte{byte(i), 0, 0xff}}
	}
	recs[1].Key, recs[2].Key, recs[3].Value, recs[4].Value = nil, []byte{}, nil, []byte{}
	var ids []int64
	var txid string
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if ids, err = w.WriteTx(ctx, tx, recs...); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&txid)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != n {
		t.Fatalf("%d ids, want %d distinct ascending", len(ids), n)
	}
	rows, err := b.pool.Query(ctx, `SELECT o.id, o.topic, o.key, o.value, o.outbox_id::text, o.txid::text, o.state,
			extract(epoch FROM clock_timestamp() - o.created_at)::float8, c.commit_seq
		FROM `+b.t.Outbox+` o LEFT JOIN `+b.commits+` c USING (txid) WHERE o.id = ANY($1) ORDER BY o.id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	uuids := map[string]bool{}
	i := 0
	for ; rows.Next(); i++ {
		var id int64
		var topic, oid, rowTx, state string
		var key, value []byte
		var age float64
		var seq *int64
		if err := rows.Scan(&id, &topic, &key, &value, &oid, &rowTx, &state, &age, &seq); err != nil {
			t.Fatal(err)
		}
		r := recs[i]
		if id != ids[i] || topic != r.Topic || (key == nil) != (r.Key == nil) || !bytes.Equal(key, r.Key) || (value == nil) != (r.Value == nil) || !bytes.Equal(value, r.Value) {
			t.Fatalf("row %d (id %d): %s %v %v, want id %d %+v", i, id, topic, key, value, ids[i], r)
		}
		if len(oid) != 36 || oid[14] != '4' || uuids[oid] {
			t.Fatalf("row %d: outbox_id %s, want a new version-4 UUID", i, oid)
		}
		uuids[oid] = true
		if rowTx != txid || state != "pending" || seq == nil || age < 0 || age > 60 {
			t.Fatalf("row %d: txid %s (want %s), state %s, commit_seq %v, created %.1fs ago", i, rowTx, txid, state, seq, age)
		}
	}
	if err := rows.Err(); err != nil || i != n {
		t.Fatalf("read %d rows (%v), want %d", i, err, n)
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		recs[i].Topic = "rolled-back"
	}
	if _, err := w.WriteTx(ctx, tx, recs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.t.Outbox+` WHERE topic = 'rolled-back'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("rolled-back records stored: %d, %v", left, err)
	}
}
