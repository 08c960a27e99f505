package shards

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// moveFixture is two migrated shards in one schema, s1 also the directory, each with a user
// table orders(topic, partition, n) moved by hook and removed by undo.
type moveFixture struct {
	schema string
	set    *Set
	s1, s2 *pgxpool.Pool
}

func newMoveFixture(t *testing.T) *moveFixture {
	t.Helper()
	ctx := context.Background()
	p1 := testenv.Postgres(t)
	schema := testenv.Schema(t, p1)
	p2, err := pgxpool.New(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p2.Close)
	for _, p := range []*pgxpool.Pool{p1, p2} {
		if _, err := migrations.Apply(ctx, p, schema); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "orders"}.Sanitize()+` (topic text, partition int, n int)`); err != nil {
			t.Fatal(err)
		}
	}
	return &moveFixture{schema: schema, s1: p1, s2: p2,
		set: &Set{Directory: p1, Shards: []Shard{{Name: "s1", Pool: p1}, {Name: "s2", Pool: p2}}}}
}

func (f *moveFixture) orders() string { return pgx.Identifier{f.schema, "orders"}.Sanitize() }

// hook moves the partition's orders (idempotent on to).
func (f *moveFixture) hook(ctx context.Context, from, to pgx.Tx, group, topic string, partition int32) error {
	if _, err := to.Exec(ctx, `DELETE FROM `+f.orders()+` WHERE topic = $1 AND partition = $2`, topic, partition); err != nil {
		return err
	}
	rows, err := from.Query(ctx, `DELETE FROM `+f.orders()+` WHERE topic = $1 AND partition = $2 RETURNING topic, partition, n`, topic, partition)
	if err != nil {
		return err
	}
	data, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	if err != nil {
		return err
	}
	_, err = to.CopyFrom(ctx, pgx.Identifier{f.schema, "orders"}, []string{"topic", "partition", "n"}, pgx.CopyFromRows(data))
	return err
}

func (f *moveFixture) undo(ctx context.Context, to pgx.Tx, group, topic string, partition int32) error {
	_, err := to.Exec(ctx, `DELETE FROM `+f.orders()+` WHERE topic = $1 AND partition = $2`, topic, partition)
	return err
}

// where says, for each shard, how many orders and watermark rows of the partition it holds,
// and its shard_move_cancel audit rows: "s1 orders=3 marks=1 cancels=0; s2 ...".
func (f *moveFixture) where(t *testing.T) string {
	t.Helper()
	out := ""
	for _, sh := range f.set.Shards {
		var orders, marks, cancels int64
		err := sh.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+f.orders()+`),
			(SELECT count(*) FROM `+pgx.Identifier{f.schema, "watermarks"}.Sanitize()+`),
			(SELECT count(*) FROM `+pgx.Identifier{f.schema, "offset_audit"}.Sanitize()+` WHERE kind = 'shard_move_cancel')`).Scan(&orders, &marks, &cancels)
		if err != nil {
			t.Fatal(err)
		}
		out += fmt.Sprintf("%s orders=%d marks=%d cancels=%d; ", sh.Name, orders, marks, cancels)
	}
	return out
}

var errCrash = errors.New("test: the mover died here")

// crashAt makes the next mover stop right after step (as a SIGKILL there would).
func crashAt(t *testing.T, step string) {
	testAfterStep = func(s string) error {
		if s == step {
			return errCrash
		}
		return nil
	}
	t.Cleanup(func() { testAfterStep = nil })
}

// Issue 46: a move whose mover dies after each of its steps, then resumed or cancelled: the
// partition's watermark and its orders (the hook's rows) end on exactly one shard, once; a
// cancel before the cut-over puts them back on s1 (active, the epoch raised past the move's,
// a shard_move_cancel row on both shards) and removes the target's copy (the undo hook);
// a cancel after the cut-over (the state deleted on s1) is refused with *CutOverError and the
// resumed move finishes; a cancel that itself dies halfway is run again.
func TestMoveCrashedAtEachStepThenResumedOrCancelled(t *testing.T) {
	ctx := context.Background()
	const group, topic = "g", "orders"
	for _, c := range []struct {
		step, action, cancelCrash string
		want                      string // where the state ends
	}{
		{"directory", "resume", "", "s2"},
		{"directory", "cancel", "", "s1"},
		{"target", "resume", "", "s2"},
		{"target", "cancel", "", "s1"},
		{"target", "cancel", "cancel-target", "s1"},
		{"target", "cancel", "cancel-directory", "s1"},
		{"source", "resume", "", "s2"},
		{"source", "cancel", "", "s2"}, // refused: finished by a resume
	} {
		t.Run(c.step+"-"+c.action+"-"+c.cancelCrash, func(t *testing.T) {
			f := newMoveFixture(t)
			if _, err := f.s1.Exec(ctx, `INSERT INTO `+pgx.Identifier{f.schema, "watermarks"}.Sanitize()+` (group_id, topic, partition, next_offset, first_offset)
				VALUES ($1, $2, 0, 10, 0)`, group, topic); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s1.Exec(ctx, `INSERT INTO `+f.orders()+` SELECT $1, 0, n FROM generate_series(1, 3) n`, topic); err != nil {
				t.Fatal(err)
			}
			if _, _, err := NewDirectory(f.s1, f.schema).Assign(ctx, group, topic, 0, "s1"); err != nil {
				t.Fatal(err)
			}
			mo := MoveOptions{Group: group, Topic: topic, Partition: 0, To: "s2", Reason: "test", Hook: f.hook}
			crashAt(t, c.step)
			if _, err := Move(ctx, f.set, f.schema, mo); !errors.Is(err, errCrash) {
				t.Fatalf("move: %v, want the injected crash", err)
			}
			testAfterStep = nil
			co := CancelOptions{Group: group, Topic: topic, Partition: 0, Reason: "test: cancelled", Undo: f.undo}
			wantEpoch := int64(2)
			switch c.action {
			case "resume":
				e, err := Move(ctx, f.set, f.schema, mo)
				if err != nil || e.Shard != "s2" || e.State != StateActive || e.Epoch != 2 {
					t.Fatalf("resumed move: %+v, %v; want active on s2 at epoch 2", e, err)
				}
			case "cancel":
				if c.cancelCrash != "" {
					crashAt(t, c.cancelCrash)
					if _, err := CancelMove(ctx, f.set, f.schema, co); !errors.Is(err, errCrash) {
						t.Fatalf("cancel: %v, want the injected crash", err)
					}
					testAfterStep = nil
				}
				e, err := CancelMove(ctx, f.set, f.schema, co)
				if c.step == "source" {
					var cut *CutOverError
					if !errors.As(err, &cut) {
						t.Fatalf("cancel after the cut-over: %+v, %v; want *CutOverError", e, err)
					}
					if e, err = Move(ctx, f.set, f.schema, mo); err != nil || e.Shard != "s2" || e.Epoch != 2 {
						t.Fatalf("the move finished after the refused cancel: %+v, %v", e, err)
					}
					break
				}
				var nm *NotMovingError
				if c.cancelCrash == "cancel-directory" && errors.As(err, &nm) {
					e = *nm.Entry // the first cancel got past its directory step
					err = nil
				}
				wantEpoch = 3
				if err != nil || e.Shard != "s1" || e.State != StateActive || e.Epoch != 3 || e.MovingTo != "" {
					t.Fatalf("cancel: %+v, %v; want active on s1 at epoch 3", e, err)
				}
			}
			es, err := NewDirectory(f.s1, f.schema).List(ctx, group)
			if err != nil || len(es) != 1 || es[0].Shard != c.want || es[0].Epoch != wantEpoch || es[0].State != StateActive {
				t.Fatalf("directory %+v, %v; want active on %s at epoch %d", es, err, c.want, wantEpoch)
			}
			want := "s1 orders=3 marks=1 cancels=0; s2 orders=0 marks=0 cancels=0; "
			if c.want == "s2" {
				want = "s1 orders=0 marks=0 cancels=0; s2 orders=3 marks=1 cancels=0; "
			}
			if c.action == "cancel" && c.want == "s1" {
				want = "s1 orders=3 marks=1 cancels=1; s2 orders=0 marks=0 cancels=1; "
				if c.cancelCrash == "cancel-directory" {
					want = "s1 orders=3 marks=1 cancels=0; s2 orders=0 marks=0 cancels=1; " // died before its row on s1
				}
				if c.cancelCrash == "cancel-target" {
					want = "s1 orders=3 marks=1 cancels=1; s2 orders=0 marks=0 cancels=2; " // one row per cancel that cleared s2
				}
			}
			if got := f.where(t); got != want {
				t.Errorf("after %s at %s: %s\nwant %s", c.action, c.step, got, want)
			}
			if _, err := CancelMove(ctx, f.set, f.schema, co); !errors.As(err, new(*NotMovingError)) {
				t.Errorf("a second cancel: %v; want *NotMovingError", err)
			}
		})
	}
}

// Issue 46: the cut-over waits for the old shard's outbox. With a row pending on s1 and no
// relay there, the move fails after DrainWithin with *DrainError, the row stays moving and s1
// keeps the partition's state; once the row is published, the same move resumes and finishes.
func TestMoveWaitsForTheOldShardsOutbox(t *testing.T) {
	ctx := context.Background()
	f := newMoveFixture(t)
	if _, err := f.s1.Exec(ctx, `INSERT INTO `+pgx.Identifier{f.schema, "watermarks"}.Sanitize()+` (group_id, topic, partition, next_offset, first_offset)
		VALUES ('g', 't', 0, 10, 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s1.Exec(ctx, `INSERT INTO `+pgx.Identifier{f.schema, "outbox"}.Sanitize()+` (topic, key, value) VALUES ('out', 'k', 'v')`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewDirectory(f.s1, f.schema).Assign(ctx, "g", "t", 0, "s1"); err != nil {
		t.Fatal(err)
	}
	mo := MoveOptions{Group: "g", Topic: "t", Partition: 0, To: "s2", Reason: "test", Hook: f.hook, DrainWithin: 300 * time.Millisecond}
	_, err := Move(ctx, f.set, f.schema, mo)
	var de *DrainError
	if !errors.As(err, &de) || de.Shard != "s1" || de.Waiting != 1 || !strings.Contains(err.Error(), "run the move again") {
		t.Fatalf("move with s1's outbox undrained: %v; want *DrainError naming s1 and 1 row", err)
	}
	es, err := NewDirectory(f.s1, f.schema).List(ctx, "g")
	if err != nil || len(es) != 1 || es[0].State != StateMoving || es[0].Shard != "s1" {
		t.Fatalf("directory after the refused cut-over: %+v, %v; want moving, on s1", es, err)
	}
	if got, want := f.where(t), "s1 orders=0 marks=1 cancels=0; s2 orders=0 marks=0 cancels=0; "; got != want {
		t.Fatalf("after the refused cut-over: %s, want %s", got, want)
	}
	if _, err := f.s1.Exec(ctx, `UPDATE `+pgx.Identifier{f.schema, "outbox"}.Sanitize()+` SET state = 'published', resolved_at = now()`); err != nil {
		t.Fatal(err)
	}
	if e, err := Move(ctx, f.set, f.schema, mo); err != nil || e.Shard != "s2" || e.State != StateActive {
		t.Fatalf("resumed move after the drain: %+v, %v", e, err)
	}
}
