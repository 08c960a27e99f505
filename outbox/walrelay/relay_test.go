package walrelay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kafkatx/kafkatx/outbox"
)

// Records of committed transactions arrive once each, per key in commit order, with the
// outbox id and position headers; an aborted transaction publishes nothing; a plain-SQL
// INSERT INTO kafkatx.outbox is published and stores no row; the slot's confirmed position
// moves only past what was published.
func TestPublishesCommittedRecordsOnceInCommitOrder(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	r, _, _ := b.start(t, b.config(t))
	var want []string
	perKey := map[string][]string{}
	for tx := 0; tx < 20; tx++ {
		tag := "t" + strconv.Itoa(tx)
		b.write(t, tag, 50, 5)
		for i := 0; i < 50; i++ {
			v := tag + "-" + strconv.Itoa(i)
			want = append(want, v)
			k := "k" + strconv.Itoa(i%5)
			perKey[k] = append(perKey[k], v)
		}
		if tx == 10 {
			ctx := context.Background()
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := outbox.WriteTx(ctx, tx, outbox.Record{Topic: b.topic, Key: []byte("k0"), Value: []byte("aborted")}); err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback(ctx)
		}
	}
	tag, err := b.pool.Exec(context.Background(), `INSERT INTO kafkatx.outbox (topic, key, value) VALUES ($1, 'sql'::bytea, 'from-sql'::bytea) RETURNING id`, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 0 {
		t.Fatalf("plain-SQL insert in WAL mode reported %d rows, want 0 (the trigger stores none)", tag.RowsAffected())
	}
	want = append(want, "from-sql")
	msgs := readAll(t, b.brokers, b.topic, len(want), 2*time.Second, 60*time.Second)
	onceEach(t, msgs, want)
	got := map[string][]string{}
	for _, m := range msgs {
		got[string(m.Key)] = append(got[string(m.Key)], string(m.Value))
		var pos string
		for _, h := range m.Headers {
			if h.Key == HeaderPosition {
				pos = string(h.Value)
			}
		}
		if !strings.Contains(pos, "#") {
			t.Fatalf("record %q: position header %q", m.Value, pos)
		}
	}
	for k, vs := range perKey {
		if strings.Join(got[k], ",") != strings.Join(vs, ",") {
			t.Fatalf("key %s: published out of commit order", k)
		}
	}
	var rows int64
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM kafkatx.outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("outbox table holds %d rows (%v), want 0 in WAL mode", rows, err)
	}
	if s := r.Stats(); s.Published != int64(len(want)) {
		t.Fatalf("Stats.Published %d, want %d", s.Published, len(want))
	}
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		pending, err := r.Pending(context.Background())
		if err != nil || pending {
			t.Fatalf("Pending after everything was published: %v, %v", pending, err)
		}
		t.Logf("Pending answered false in %v", time.Since(t0).Round(time.Millisecond))
	}
}

// A SIGKILL of the relay at each point of its cycle — after decoding a record, after
// producing it, before and after the Kafka commit, before confirming the slot's position —
// and a restart: a read_committed reader sees every record exactly once.
func TestSIGKILLAtEachPointPublishesEachRecordOnce(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	for _, point := range []string{"after-decode:150", "after-produce:700", "before-kafka-commit:1", "after-kafka-commit:1", "before-confirm:2"} {
		t.Run(strings.Split(point, ":")[0], func(t *testing.T) {
			b := newBundle(t)
			for i := 0; i < 10; i++ {
				b.write(t, "a"+strconv.Itoa(i), 100, 7)
			}
			c := b.startChild(t, point)
			if !c.killedWithin(60 * time.Second) {
				t.Fatalf("the relay did not reach %s", point)
			}
			for i := 0; i < 10; i++ {
				b.write(t, "b"+strconv.Itoa(i), 100, 7)
			}
			b.startChild(t, "")
			var want []string
			for i := 0; i < 10; i++ {
				want = append(want, values("a"+strconv.Itoa(i), 100)...)
			}
			for i := 0; i < 10; i++ {
				want = append(want, values("b"+strconv.Itoa(i), 100)...)
			}
			onceEach(t, readAll(t, b.brokers, b.topic, len(want), 3*time.Second, 90*time.Second), want)
		})
	}
}

// Two relays on one slot: the second waits (55006) while the first streams, ready as a
// standby, takes over when it stops, and together they publish each record once.
func TestSecondRelayWaitsForTheSlotAndTakesOver(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	r1, stop1, done1 := b.start(t, b.config(t))
	waitStreaming(t, r1)
	cfg2 := b.config(t)
	core, logs := observer.New(zap.InfoLevel)
	cfg2.Logger = zap.New(core)
	r2, _, _ := b.start(t, cfg2)
	b.write(t, "x", 500, 10)
	// Past NotReadyAfter: a standby is ready (it was reported "cannot publish" after 10 s,
	// which made a second replica of a service running its relay in-process not ready).
	time.Sleep(NotReadyAfter + time.Second)
	if s := r2.Stats(); s.Streaming || !s.Standby {
		t.Fatalf("the second relay while the first holds the slot: streaming %v, standby %v; want a standby", s.Streaming, s.Standby)
	}
	if err := r2.Ready(context.Background()); err != nil {
		t.Fatalf("the standby relay is not ready: %v", err)
	}
	// It retried every RetryInterval (100 ms here): one line when it started waiting, not one
	// per retry, and no "reconnecting" warning for a slot another relay streams.
	if n := logs.FilterMessageSnippet("in use by another relay").Len(); n != 1 {
		t.Errorf("%d lines about the slot in use over %s of waiting, want 1", n, NotReadyAfter+time.Second)
	}
	if n := logs.FilterMessageSnippet("reconnecting").Len(); n != 0 {
		t.Errorf("%d reconnecting warnings from a standby, want 0", n)
	}
	stop1()
	<-done1
	done1 <- nil // for the cleanup
	b.write(t, "y", 500, 10)
	waitStreaming(t, r2)
	want := append(values("x", 500), values("y", 500)...)
	onceEach(t, readAll(t, b.brokers, b.topic, len(want), 2*time.Second, 60*time.Second), want)
}

func waitStreaming(t *testing.T, r *Relay) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if r.Stats().Streaming {
			return
		}
	}
	t.Fatal("the relay does not stream within 30 s")
}

// The slot is created by SetMode before any writer emits, so the first records after a fresh
// deploy are published; a writer refuses to emit when the slot is missing, and the relay
// stops with a FatalError saying what was lost.
func TestFreshDeployPublishesFirstEventsAndMissingSlotIsRefusedLoudly(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	b.write(t, "first", 3, 3) // before any relay ran
	r, _, done := b.start(t, b.config(t))
	onceEach(t, readAll(t, b.brokers, b.topic, 3, time.Second, 30*time.Second), values("first", 3))
	_ = r
	// Drop the slot under the relay (as an operator's mistake would).
	ctx := context.Background()
	for i := 0; ; i++ {
		_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, b.slot)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = b.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, b.slot); err == nil {
			break
		}
		if i > 100 {
			t.Fatalf("drop slot: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.WriteTx(ctx, tx, outbox.Record{Topic: b.topic, Value: []byte("lost?")})
		return err
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "KX002" {
		t.Fatalf("write with the slot missing: %v, want SQLSTATE KX002", err)
	}
	select {
	case err := <-done:
		var fe *FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("relay ended with %v, want a FatalError naming the missing slot and the loss", err)
		}
		done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("the relay goes on without its slot")
	}
	// A relay started without the slot names the checkpoint the events are missing from and
	// the commands that recover, the checkpoint's time filled in.
	_, _, done = b.start(t, b.config(t))
	select {
	case err := <-done:
		var fe *FatalError
		if !errors.As(err, &fe) {
			t.Fatalf("relay started without its slot ended with %v, want a FatalError", err)
		}
		for _, want := range []string{"does not exist on this server", "server timeline 1", "after commit LSN", "on timeline 1 (the checkpoint published 20",
			"kafkatx migrate up --outbox-mode wal", "--to-time 20", "--mode replay --reason TEXT --execute"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("the missing slot's error lacks %q: %v", want, err)
			}
		}
		done <- nil
	case <-time.After(30 * time.Second):
		t.Fatal("a relay starts without its slot")
	}
	b.slot = ""
}

// One transaction of 100,000 records is published whole, in one Kafka transaction, and the
// relay's Go heap stays bounded (records are produced while decoded, never held).
func TestTransactionOf100000Records(t *testing.T) {
	// Not parallel: the heap bound below is the process's, and parallel tests' heaps would
	// count in it (CI: 220 MiB with the package's other tests running beside it).
	if testing.Short() {
		t.Skip("100,000 records")
	}
	b := newBundle(t)
	b.write(t, "big", 100000, 1000)
	r, _, _ := b.start(t, b.config(t))
	peak := watchHeap(t)
	msgs := readAll(t, b.brokers, b.topic, 100000, 3*time.Second, 180*time.Second)
	onceEach(t, msgs, values("big", 100000))
	if s := r.Stats(); s.Transactions < 1 {
		t.Fatalf("no Kafka transaction committed")
	}
	if p := peak(); p > 200<<20 {
		t.Fatalf("heap peaked at %d MiB during a 100,000-record transaction", p>>20)
	} else {
		t.Logf("heap peak %d MiB", p>>20)
	}
}

var _ = fmt.Sprintf
