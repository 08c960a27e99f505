package parking_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The store's calls over one partition: a key's messages in offset order, its head due, a
// failed try, the take that fences a second owner, an operator's release and dead-letter.
func TestParkedKeysStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	s := parking.New(schema)
	park := func(off int64, key []byte, next time.Time) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		big := bytes.Repeat([]byte("k"), 5000) // longer than any B-tree entry may be
		if key != nil {
			key = append(big, key...)
		}
		if err := s.ParkTx(ctx, tx, parking.Message{Group: "g", Topic: "t", Partition: 0, Offset: off, KeyHash: parking.KeyHash(key, off),
			Key: key, Value: []byte("v"), Headers: []parking.Header{{Key: "h", Value: nil}, {Key: "x", Value: []byte("y")}},
			Attempts: 1, ErrorClass: "error", LastError: "503", NextTry: next}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	park(5, []byte("a"), now.Add(time.Hour))
	park(9, []byte("a"), time.Time{})
	park(7, []byte("b"), now.Add(-time.Second))
	park(8, nil, time.Time{})
	park(11, nil, time.Time{})

	counts, err := s.Counts(ctx, pool, "g", "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	ka := parking.KeyHash(append(bytes.Repeat([]byte("k"), 5000), 'a'), 0)
	if len(counts) != 4 || counts[string(ka)] != 2 {
		t.Fatalf("counts %v: want 4 keys (two nil keys each their own), key a 2", counts)
	}
	due, err := s.Due(ctx, pool, "g", "t", 0, now, 10)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for _, m := range due {
		offs = append(offs, m.Offset)
	}
	if len(offs) != 3 || offs[0] != 8 || offs[1] != 11 || offs[2] != 7 {
		t.Fatalf("due heads %v, want [8 11 7] (key a's head 5 waits an hour; 9 is behind it)", offs)
	}
	if h := due[2].Headers; len(h) != 2 || h[0].Value != nil || string(h[1].Value) != "y" {
		t.Fatalf("headers %+v not kept byte for byte", h)
	}
	if err := s.Failed(ctx, pool, "g", "t", 0, 7, 2, "error", "again", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Two owners take head 8: the second finds it gone.
	tx1, _ := pool.Begin(ctx)
	defer tx1.Rollback(ctx)
	if err := s.TakeTx(ctx, tx1, "g", "t", 0, 8); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tx2, _ := pool.Begin(ctx)
		defer tx2.Rollback(ctx)
		done <- s.TakeTx(ctx, tx2, "g", "t", 0, 8)
	}()
	time.Sleep(200 * time.Millisecond)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, parking.ErrGone) {
		t.Fatalf("second take: %v, want ErrGone", err)
	}
	keys, err := s.Keys(ctx, pool, "g", "t", -1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0].HeadOffset != 5 || keys[0].Count != 2 || keys[1].HeadOffset != 7 || keys[1].Attempts != 2 || keys[1].LastError != "again" {
		t.Fatalf("keys %+v", keys)
	}
	if ok, err := s.Release(ctx, pool, "g", "t", 0, ka); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if due, _ := s.Due(ctx, pool, "g", "t", 0, time.Now().Add(time.Second), 10); len(due) != 2 || due[0].Offset != 5 && due[1].Offset != 5 {
		t.Fatalf("after release, due %+v: want key a's head 5 among them", due)
	}
	tx, _ := pool.Begin(ctx)
	var took []int64
	n, err := s.TakeKeyTx(ctx, tx, "g", "t", 0, ka, true, func(m parking.Message) error { took = append(took, m.Offset); return nil })
	if err != nil || n != 2 || took[0] != 5 || took[1] != 9 {
		t.Fatalf("take key a: %d %v %v", n, took, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	offsets, err := s.Offsets(ctx, pool, "g", "t", 0, 0, -1)
	if err != nil || len(offsets) != 2 || offsets[0] != 7 || offsets[1] != 11 {
		t.Fatalf("offsets left %v %v, want [7 11]", offsets, err)
	}
	tot, err := s.Totals(ctx, pool, "g", "")
	if err != nil || len(tot) != 1 || tot[0].Keys != 2 || tot[0].Messages != 2 {
		t.Fatalf("totals %+v %v", tot, err)
	}
}
