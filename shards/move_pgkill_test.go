package shards

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue 46: a shard's PostgreSQL killed during a move — the target's before or inside its
// transaction, the source's (which holds the directory too) inside its transaction, between
// the target's commit and its own, or after its own before the directory's cut-over — then
// started again, and the move resumed or cancelled (or, killed after it committed, none): the partition's watermark and its orders
// (the hook's rows) end on exactly one shard, once, and the directory names that shard. Two
// clusters of the test's own (s1 with the directory, s2), stopped immediate (the postmaster
// and its backends gone at once, crash recovery at the start), one partition a case.
func TestMoveWithAShardsPostgreSQLKilledAtEachStep(t *testing.T) {
	ctx := context.Background()
	pgs := map[string]*testenv.OwnPostgres{"s1": testenv.StartOwnPostgres(t, ""), "s2": testenv.StartOwnPostgres(t, "")}
	const schema, group, topic = "kafkatx", "g", "orders"
	pools := map[string]*pgxpool.Pool{}
	for name, o := range pgs {
		p, err := pgxpool.New(ctx, o.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		if _, err := migrations.Apply(ctx, p, schema); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Exec(ctx, `CREATE TABLE kafkatx.orders (topic text, partition int, n int)`); err != nil {
			t.Fatal(err)
		}
		pools[name] = p
	}
	f := &moveFixture{schema: schema, s1: pools["s1"], s2: pools["s2"],
		set: &Set{Directory: pools["s1"], Shards: []Shard{{Name: "s1", Pool: pools["s1"]}, {Name: "s2", Pool: pools["s2"]}}}}
	// where says, for partition p, what each shard holds: "s1 orders=3 marks=1; s2 orders=0 marks=0".
	where := func(p int32) string {
		out := ""
		for _, name := range []string{"s1", "s2"} {
			var orders, marks int64
			err := pools[name].QueryRow(ctx, `SELECT (SELECT count(*) FROM kafkatx.orders WHERE partition = $1),
				(SELECT count(*) FROM kafkatx.watermarks WHERE group_id = $2 AND partition = $1)`, p, group).Scan(&orders, &marks)
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			out += fmt.Sprintf("%s orders=%d marks=%d; ", name, orders, marks)
		}
		return out
	}
	for i, c := range []struct {
		kill, at, then string
		want           string // the shard the partition ends on
	}{
		{"s2", "directory", "resume", "s2"}, // the target down when the copy begins
		{"s2", "hook", "resume", "s2"},      // the target dies inside its transaction
		{"s2", "hook", "cancel", "s1"},
		{"s2", "target", "", "s2"},       // the target after its commit: the move finishes, the copy durable
		{"s1", "hook", "resume", "s2"},   // the source (and the directory) inside its transaction
		{"s1", "target", "resume", "s2"}, // between the target's commit and the source's
		{"s1", "target", "cancel", "s1"},
		{"s1", "source", "resume", "s2"}, // after the source's commit, before the cut-over
	} {
		p := int32(i)
		t.Run(fmt.Sprintf("%s-at-%s-then-%s", c.kill, c.at, c.then), func(t *testing.T) {
			if _, err := pools["s1"].Exec(ctx, `INSERT INTO kafkatx.watermarks (group_id, topic, partition, next_offset, first_offset) VALUES ($1, $2, $3, 10, 0)`, group, topic, p); err != nil {
				t.Fatal(err)
			}
			if _, err := pools["s1"].Exec(ctx, `INSERT INTO kafkatx.orders SELECT $1, $2, n FROM generate_series(1, 3) n`, topic, p); err != nil {
				t.Fatal(err)
			}
			if _, _, err := NewDirectory(pools["s1"], schema).Assign(ctx, group, topic, p, "s1"); err != nil {
				t.Fatal(err)
			}
			killed, down := false, false
			kill := func() {
				if !killed {
					killed, down = true, true
					pgs[c.kill].Stop(t, "immediate")
				}
			}
			t.Cleanup(func() { // a failed case leaves the next ones a running server
				if down {
					pgs[c.kill].Start(t)
				}
			})
			hook := func(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error {
				if c.at == "hook" {
					kill()
				}
				return f.hook(ctx, from, to, group, topic, partition)
			}
			testAfterStep = func(s string) error {
				if s == c.at {
					kill()
				}
				return nil
			}
			t.Cleanup(func() { testAfterStep = nil })
			mo := MoveOptions{Group: group, Topic: topic, Partition: p, To: "s2", Reason: "test", Hook: hook}
			e, err := Move(ctx, f.set, schema, mo)
			if !killed || (c.then != "") != (err != nil) {
				t.Fatalf("move with %s killed at %s: %+v, %v (killed %v); want an error: %v", c.kill, c.at, e, err, killed, c.then != "")
			}
			testAfterStep = nil
			pgs[c.kill].Start(t)
			down = false
			for _, pl := range pools {
				pl.Reset() // the killed server's connections
			}
			mo.Hook = f.hook
			wantEpoch := int64(2)
			switch c.then {
			case "resume":
				if e, err := Move(ctx, f.set, schema, mo); err != nil || e.Shard != "s2" || e.State != StateActive || e.Epoch != 2 {
					t.Fatalf("resumed move: %+v, %v; want active on s2 at epoch 2", e, err)
				}
			case "cancel":
				co := CancelOptions{Group: group, Topic: topic, Partition: p, Reason: "test: cancelled", Undo: f.undo}
				if e, err := CancelMove(ctx, f.set, schema, co); err != nil || e.Shard != "s1" || e.State != StateActive || e.Epoch != 3 {
					t.Fatalf("cancel: %+v, %v; want active on s1 at epoch 3", e, err)
				}
				wantEpoch = 3
			}
			d, err := NewDirectory(pools["s1"], schema).Entry(ctx, group, topic, p)
			if err != nil || d == nil {
				t.Fatalf("directory row: %+v, %v", d, err)
			}
			if d.Shard != c.want || d.Epoch != wantEpoch || d.State != StateActive {
				t.Fatalf("directory %+v; want active on %s at epoch %d", d, c.want, wantEpoch)
			}
			want := "s1 orders=3 marks=1; s2 orders=0 marks=0; "
			if c.want == "s2" {
				want = "s1 orders=0 marks=0; s2 orders=3 marks=1; "
			}
			if got := where(p); got != want {
				t.Errorf("after %s killed at %s and a %s: %s\nwant %s", c.kill, c.at, c.then, got, want)
			}
			for name, pl := range pools {
				var n int64
				if err := pl.QueryRow(ctx, `SELECT count(*) FROM kafkatx.offset_audit WHERE kind = 'watermark_deleted' AND partition = $1`, p).Scan(&n); err != nil || n != 0 {
					t.Errorf("%d watermark_deleted rows on %s (%v), want 0", n, name, err)
				}
			}
		})
	}
}
