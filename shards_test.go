package kafkatx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// shardPool opens a fresh database as a shard, with kafkatx's schema and the test handlers'
// effects table in schema.
func shardPool(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &testBundle{pool: pool, schema: schema}
	b.migrateWithEffects(t)
	return pool
}

// TestShardsKeepEachPartitionOnItsShard runs a consumer over two shards (two databases) with
// the directory in a third: each message is applied once, on its partition's shard, the
// partition's watermark is there and nowhere else, an unmapped partition lands on the first
// shard and is recorded there, and a restart finds every partition where it left it.
func TestShardsKeepEachPartitionOnItsShard(t *testing.T) {
	b := setup(t, 4)
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	ctx := context.Background()
	dir := shards.NewDirectory(b.pool, b.schema)
	for p, to := range map[int32]string{0: "s1", 2: "s2", 3: "s2"} { // partition 1: unmapped
		if _, changed, err := dir.Assign(ctx, b.group, b.topic, p, to); err != nil || !changed {
			t.Fatalf("assign %d to %s: changed %v, %v", p, to, changed, err)
		}
	}
	if _, _, err := dir.Assign(ctx, b.group, b.topic, 3, "s1"); err == nil {
		t.Fatal("assigning a mapped partition to another shard was not refused")
	}
	set := &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	h := Handler(func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) })
	count := func(pool *pgxpool.Pool, sql string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, fmt.Sprintf(sql, pgx.Identifier{b.schema, "effects"}.Sanitize())).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	applied := func() int64 {
		return count(s1, `SELECT count(*) FROM %s`) + count(s2, `SELECT count(*) FROM %s`)
	}
	for round, n := range []int{30, 20} {
		for p := int32(0); p < 4; p++ {
			produce(t, b.brokers, b.topic, values(n, p, func(i int) string { return fmt.Sprintf("r%d-p%d-%d", round, p, i) }))
		}
		cfg := b.config(t)
		cfg.Shards = set
		r := b.start(t, h, cfg)
		want := int64(4 * 30)
		if round == 1 {
			want = 4 * 50
		}
		r.waitFor(t, 90*time.Second, fmt.Sprintf("%d messages applied over the shards", want), func() bool { return applied() >= want })
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if got := applied(); got != want {
			t.Fatalf("round %d: %d messages applied, want %d", round, got, want)
		}
	}
	for _, c := range []struct {
		name  string
		pool  *pgxpool.Pool
		parts string
	}{{"s1", s1, "0,1"}, {"s2", s2, "2,3"}} {
		var effects, marks string
		var twice int64
		q := fmt.Sprintf(`SELECT coalesce(string_agg(DISTINCT partition::text, ','), ''), count(*) FILTER (WHERE applied > 1) FROM %s`, pgx.Identifier{b.schema, "effects"}.Sanitize())
		if err := c.pool.QueryRow(ctx, q).Scan(&effects, &twice); err != nil {
			t.Fatal(err)
		}
		q = fmt.Sprintf(`SELECT coalesce(string_agg(partition::text, ',' ORDER BY partition), '') FROM %s WHERE group_id = $1 AND next_offset = 50`, pgx.Identifier{b.schema, "watermarks"}.Sanitize())
		if err := c.pool.QueryRow(ctx, q, b.group).Scan(&marks); err != nil {
			t.Fatal(err)
		}
		if effects != c.parts || marks != c.parts || twice != 0 {
			t.Errorf("shard %s: effects of partitions [%s], watermarks at 50 of [%s], %d applied twice; want [%s], [%s], 0", c.name, effects, marks, twice, c.parts, c.parts)
		}
	}
	if n := b.q(t, `SELECT count(*) FROM `+pgx.Identifier{b.schema, "watermarks"}.Sanitize()); n != 0 {
		t.Errorf("the directory's database holds %d watermarks; it is no shard here", n)
	}
	es, err := dir.List(ctx, b.group)
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, e := range es {
		got += fmt.Sprintf("%d:%s/%d/%s ", e.Partition, e.Shard, e.Epoch, e.State)
	}
	if want := "0:s1/1/active 1:s1/1/active 2:s2/1/active 3:s2/1/active "; got != want {
		t.Errorf("directory %q, want %q", got, want)
	}
}

// TestShardsValidate: a Config.Shards without a directory, without shards, with a bad or
// repeated name or a nil pool is refused by NewConsumer.
func TestShardsValidate(t *testing.T) {
	for _, s := range []*shards.Set{
		{},
		{Directory: &pgxpool.Pool{}},
		{Directory: &pgxpool.Pool{}, Shards: []shards.Shard{{Name: "", Pool: &pgxpool.Pool{}}}},
		{Directory: &pgxpool.Pool{}, Shards: []shards.Shard{{Name: "a=b", Pool: &pgxpool.Pool{}}}},
		{Directory: &pgxpool.Pool{}, Shards: []shards.Shard{{Name: "a", Pool: &pgxpool.Pool{}}, {Name: "a", Pool: &pgxpool.Pool{}}}},
		{Directory: &pgxpool.Pool{}, Shards: []shards.Shard{{Name: "a"}}},
	} {
		cfg := &Config{Kafka: kafka.ConfigMap{"bootstrap.servers": "x", "group.id": "g"}, Topics: []string{"t"}, Shards: s}
		if _, err := NewConsumer(&pgxpool.Pool{}, Handler(func(context.Context, pgx.Tx, *Message) error { return nil }), cfg); err == nil {
			t.Errorf("Config.Shards %+v accepted", s)
		}
	}
}

// TestShardsMoveUnderLoad moves a partition to the other shard while one consumer runs and
// messages keep arriving: the old owner is fenced by the move and, with no restart, goes on
// on the new shard from the moved watermark; every message is applied once, none on both
// shards (the hook moved the partition's effects), the directory names the target with a
// higher epoch, both shards hold a shard_move audit row and no deletion is left unexplained.
func TestShardsMoveUnderLoad(t *testing.T) {
	b := setup(t, 2)
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	ctx := context.Background()
	set := &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	h := Handler(func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) })
	cfg := b.config(t)
	cfg.Shards = set
	cfg.Batch.Size = 20
	r := b.start(t, h, cfg)
	count := func(pool *pgxpool.Pool, where string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const rounds, per = 20, 50
	produced := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; i < rounds; i++ {
			if i == rounds/2 {
				<-moved
			}
			produce(t, b.brokers, b.topic, values(per, 1, func(j int) string { return fmt.Sprintf("p1-%d-%d", i, j) }))
			produce(t, b.brokers, b.topic, values(per, 0, func(j int) string { return fmt.Sprintf("p0-%d-%d", i, j) }))
		}
	}()
	r.waitFor(t, 60*time.Second, "partition 1 under way on s1", func() bool { return count(s1, "partition = 1") >= 2*per })
	hook := moveEffects(b.schema)
	e, err := shards.Move(ctx, set, b.schema, shards.MoveOptions{Group: b.group, Topic: b.topic, Partition: 1, To: "s2", Reason: "test: move under load", Hook: hook})
	close(moved)
	if err != nil {
		t.Fatal(err)
	}
	if e.Shard != "s2" || e.State != shards.StateActive || e.Epoch != 2 {
		t.Fatalf("after the move: %+v; want active on s2 at epoch 2", e)
	}
	<-produced
	r.waitFor(t, 90*time.Second, "every message applied", func() bool {
		return count(s1, "true")+count(s2, "true") >= 2*rounds*per
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n1, n2 := count(s1, "true"), count(s2, "true"); n1+n2 != 2*rounds*per {
		t.Errorf("%d effects on s1 and %d on s2; want %d in all", n1, n2, 2*rounds*per)
	}
	for name, pool := range map[string]*pgxpool.Pool{"s1": s1, "s2": s2} {
		if n := count(pool, "applied > 1"); n != 0 {
			t.Errorf("%s: %d messages applied twice", name, n)
		}
	}
	if n := count(s1, "partition = 1"); n != 0 {
		t.Errorf("s1 still holds %d effects of the moved partition", n)
	}
	if n := count(s2, "partition = 0"); n != 0 {
		t.Errorf("s2 holds %d effects of partition 0, which did not move", n)
	}
	audit := pgx.Identifier{b.schema, "offset_audit"}.Sanitize()
	for name, pool := range map[string]*pgxpool.Pool{"s1": s1, "s2": s2} {
		var moves, deleted int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'shard_move'), count(*) FILTER (WHERE kind IN ('watermark_deleted', 'unexplained_move'))
			FROM `+audit+` WHERE group_id = $1`, b.group).Scan(&moves, &deleted); err != nil {
			t.Fatal(err)
		}
		if moves != 1 || deleted != 0 {
			t.Errorf("%s: %d shard_move rows and %d unexplained ones; want 1 and 0", name, moves, deleted)
		}
	}
	var w1 int64
	if err := s2.QueryRow(ctx, `SELECT next_offset FROM `+pgx.Identifier{b.schema, "watermarks"}.Sanitize()+` WHERE group_id = $1 AND partition = 1`, b.group).Scan(&w1); err != nil || w1 != rounds*per {
		t.Errorf("partition 1's watermark on s2: %d (%v); want %d", w1, err, rounds*per)
	}
}

// Issue 46: a shard restored from an older backup. Partition 0 was moved to s2 and applied
// there (watermark 20); s1 comes back holding its old row (watermark 5), while the move's
// directory row is still "moving" from s1 (its mover died after the cut-over, before step
// 4). A consumer started then applies the next messages on s2 alone — never on s1's stale
// copy, whose watermark stays 5 (before, it placed the partition on s1, where a watermark
// was, and applied 5.. there again); resuming the move is refused with *StaleSourceError,
// and a cancel with *CutOverError, neither copying nor deleting anything.
func TestShardsConsumerNeverAppliesOnAStaleCopy(t *testing.T) {
	b := setup(t, 1)
	ctx := context.Background()
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	set := &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	dir := shards.NewDirectory(b.pool, b.schema)
	if _, _, err := dir.Assign(ctx, b.group, b.topic, 0, "s2"); err != nil {
		t.Fatal(err)
	}
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	watermarks := pgx.Identifier{b.schema, "watermarks"}.Sanitize()
	count := func(pool *pgxpool.Pool, where string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	h := Handler(func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) })
	cfg := b.config(t)
	cfg.Shards = set
	produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprintf("a%d", i) }))
	r := b.start(t, h, cfg)
	r.waitFor(t, 60*time.Second, "20 messages applied on s2", func() bool { return count(s2, "true") >= 20 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Exec(ctx, `INSERT INTO `+watermarks+` (group_id, topic, partition, next_offset, first_offset) VALUES ($1, $2, 0, 5, 0)`, b.group, b.topic); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE `+pgx.Identifier{b.schema, "shard_directory"}.Sanitize()+` SET shard = 's1', state = 'moving', moving_to = 's2', epoch = 2`); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, values(20, 0, func(i int) string { return fmt.Sprintf("b%d", i) }))
	r = b.start(t, h, cfg)
	r.waitFor(t, 60*time.Second, "40 messages applied", func() bool { return count(s1, "true")+count(s2, "true") >= 40 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n1, n2, twice := count(s1, "true"), count(s2, "true"), count(s2, "applied > 1"); n1 != 0 || n2 != 40 || twice != 0 {
		t.Errorf("effects: %d on s1, %d on s2 (%d applied twice); want 0, 40, 0", n1, n2, twice)
	}
	var w1 int64
	if err := s1.QueryRow(ctx, `SELECT next_offset FROM `+watermarks).Scan(&w1); err != nil || w1 != 5 {
		t.Errorf("s1's stale watermark: %d, %v; want it untouched at 5", w1, err)
	}
	_, err := shards.Move(ctx, set, b.schema, shards.MoveOptions{Group: b.group, Topic: b.topic, Partition: 0, To: "s2", Reason: "test: resume"})
	var st *shards.StaleSourceError
	if !errors.As(err, &st) || st.Source != 5 || st.Target != 40 {
		t.Errorf("resuming the move over a stale copy: %v; want *StaleSourceError 5 behind 40", err)
	}
	_, err = shards.CancelMove(ctx, set, b.schema, shards.CancelOptions{Group: b.group, Topic: b.topic, Partition: 0, Reason: "test: cancel"})
	var cut *shards.CutOverError
	if !errors.As(err, &cut) || cut.StaleSource == nil {
		t.Errorf("cancelling the move over a stale copy: %v; want *CutOverError with its stale source", err)
	}
	if count(s2, "true") != 40 || count(s1, "true") != 0 {
		t.Error("the refused resume or cancel moved effects")
	}
}

// Issue 46: a move that fails halfway (its hook errs, after kafkatx's state was copied in the
// target's transaction) and is then cancelled while the consumer runs and messages keep
// arriving: the consumer never leaves s1, every message is applied once there and none on
// s2, the directory row is active on s1 at epoch 3 (past the move's 2), and s2 holds no
// watermark of the partition.
func TestShardsMoveCancelledUnderLoad(t *testing.T) {
	b := setup(t, 1)
	ctx := context.Background()
	s1, s2 := shardPool(t, b.schema), shardPool(t, b.schema)
	set := &shards.Set{Directory: b.pool, Shards: []shards.Shard{{Name: "s1", Pool: s1}, {Name: "s2", Pool: s2}}}
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	count := func(pool *pgxpool.Pool) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	h := Handler(func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) })
	cfg := b.config(t)
	cfg.Shards = set
	cfg.Batch.Size = 10
	r := b.start(t, h, cfg)
	produce(t, b.brokers, b.topic, values(100, 0, func(i int) string { return fmt.Sprintf("a%d", i) }))
	r.waitFor(t, 60*time.Second, "partition 0 under way on s1", func() bool { return count(s1) >= 20 })
	failing := func(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error {
		if err := moveEffects(b.schema)(ctx, from, to, group, topic, partition); err != nil {
			return err
		}
		return errors.New("test: the hook fails after copying")
	}
	if _, err := shards.Move(ctx, set, b.schema, shards.MoveOptions{Group: b.group, Topic: b.topic, Partition: 0, To: "s2", Reason: "test", Hook: failing}); err == nil {
		t.Fatal("the move with a failing hook succeeded")
	}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		produce(t, b.brokers, b.topic, values(100, 0, func(i int) string { return fmt.Sprintf("b%d", i) }))
	}()
	e, err := shards.CancelMove(ctx, set, b.schema, shards.CancelOptions{Group: b.group, Topic: b.topic, Partition: 0, Reason: "test: cancel under load",
		Undo: func(ctx context.Context, to pgx.Tx, group, topic string, partition int32) error {
			_, err := to.Exec(ctx, `DELETE FROM `+effects+` WHERE topic = $1 AND partition = $2`, topic, partition)
			return err
		}})
	if err != nil || e.Shard != "s1" || e.State != shards.StateActive || e.Epoch != 3 {
		t.Fatalf("cancel: %+v, %v; want active on s1 at epoch 3", e, err)
	}
	<-produced
	r.waitFor(t, 90*time.Second, "200 messages applied on s1", func() bool { return count(s1) >= 200 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var twice, marks2 int64
	if err := s1.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE applied > 1`).Scan(&twice); err != nil {
		t.Fatal(err)
	}
	if err := s2.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{b.schema, "watermarks"}.Sanitize()).Scan(&marks2); err != nil {
		t.Fatal(err)
	}
	if n1, n2 := count(s1), count(s2); n1 != 200 || n2 != 0 || twice != 0 || marks2 != 0 {
		t.Errorf("after the cancel: %d effects on s1 (%d twice), %d on s2, %d watermarks on s2; want 200, 0, 0, 0", n1, twice, n2, marks2)
	}
}
