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

// A record larger than the topic's max.message.bytes is refused by the broker (with the
// batch it travelled in). The relay finds it by sending the refused records alone, parks it,
// holds the later rows of its key behind it, and publishes every other key. Discarding the
// parked row lets its key flow again.
func TestTooLargeRecordParksWithoutBlockingOtherKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "4000"})
	r, _ := b.start(t, b.config(t))
	big := bytes.Repeat([]byte("x"), 8000)
	var recs []outbox.Record
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("a1")})
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: big})
	for i := 0; i < 5; i++ {
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte("b"), Value: []byte{'b', byte('1' + i)}})
	}
	recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte("a3")})
	recs = append(recs, outbox.Record{Topic: topic, Value: []byte("nil key")})
	ids := b.write(t, recs...)
	bigID, a3 := ids[1], ids[7]

	waitFor(t, 60*time.Second, "the large row parked", func() bool { return b.states(t)[bigID] == "parked" })
	waitFor(t, 60*time.Second, "the other keys published", func() bool {
		st := b.states(t)
		for i, id := range ids {
			if i != 1 && i != 7 && st[id] != "published" {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second) // give the relay rounds in which it could wrongly publish a3
	if st := b.states(t)[a3]; st != "pending" {
		t.Fatalf("row a3 behind the parked row is %s, want pending", st)
	}
	if s := r.Stats(); s.Parked != 1 {
		t.Fatalf("Stats().Parked = %d, want 1", s.Parked)
	}
	parked, err := b.w.Parked(context.Background(), b.pool, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != bigID || parked[0].Waiting != 1 ||
		!strings.Contains(strings.ToLower(parked[0].LastError), "too large") {
		t.Fatalf("Parked() = %+v, %v; want the large row with 1 row waiting and a size error", parked, err)
	}
	n, _, err := r.Backlog(context.Background())
	if err != nil || n != 0 {
		t.Fatalf("Backlog = %d, %v; want 0 (the waiting row belongs to the operator)", n, err)
	}
	if pending, err := r.Pending(context.Background()); err != nil || pending {
		t.Fatalf("Pending = %v, %v; want false (only a parked row and the row behind it remain)", pending, err)
	}
	var values []string
	for _, m := range readAll(t, b.brokers, topic) {
		values = append(values, string(m.Value))
	}
	if got := strings.Join(values, ","); got != "a1,b1,b2,b3,b4,b5,nil key" {
		t.Fatalf("published %s, want a1,b1,b2,b3,b4,b5,nil key", got)
	}

	err = pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.DiscardTx(context.Background(), tx, bigID, "too large for the topic", "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a3 published after the discard", func() bool { return b.states(t)[a3] == "published" })
	msgs := readAll(t, b.brokers, topic)
	if last := msgs[len(msgs)-1]; string(last.Value) != "a3" {
		t.Fatalf("last record %q, want a3", last.Value)
	}
}

// A record larger than librdkafka's message.max.bytes is refused before it is sent: parked at
// once, and the rows of its key behind it in the same batch are not sent.
func TestRecordOverProducerLimitParksAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.Kafka["message.max.bytes"] = 10000
	r, _ := b.start(t, cfg)
	ids := b.write(t,
		outbox.Record{Topic: topic, Key: []byte("k"), Value: bytes.Repeat([]byte("y"), 20000)},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("after")},
		outbox.Record{Topic: topic, Key: []byte("other"), Value: []byte("flows")},
	)
	waitFor(t, 60*time.Second, "parked and published", func() bool {
		st := b.states(t)
		return st[ids[0]] == "parked" && st[ids[2]] == "published"
	})
	time.Sleep(500 * time.Millisecond)
	if st := b.states(t)[ids[1]]; st != "pending" {
		t.Fatalf("row behind the parked one is %s, want pending", st)
	}
	if n := topicCount(t, b.brokers, topic); n != 1 {
		t.Fatalf("topic holds %d records, want 1", n)
	}
	// Release: the operator raised the limit (here: a new relay with a larger limit).
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.ReleaseTx(context.Background(), tx, ids[0], "limit raised", "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = r
}

// Rows for a topic that does not exist wait aside while other topics flow, and are parked
// after UnknownTopicTimeout.
func TestUnknownTopicParksAfterTimeoutWhileOthersFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	missing := testenv.UniqueName(t, "kafkatx-test-missing-", 200)
	cfg := b.config(t)
	// Long enough that the existing topic's row is published well before it on a loaded
	// machine: the missing topic's rows still wait (pending) when it is.
	cfg.UnknownTopicTimeout = 20 * time.Second
	b.start(t, cfg)
	start := time.Now()
	ids := b.write(t,
		outbox.Record{Topic: missing, Key: []byte("k"), Value: []byte("nowhere")},
		outbox.Record{Topic: missing, Key: []byte("k"), Value: []byte("nowhere 2")},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("somewhere")},
	)
	waitFor(t, 60*time.Second, "the existing topic's row published", func() bool { return b.states(t)[ids[2]] == "published" })
	if st := b.states(t)[ids[0]]; st != "pending" {
		t.Fatalf("the missing topic's first row is %s when the existing topic's row is published, want pending: the existing topic waited for the missing one (%s)",
			st, time.Since(start).Round(time.Millisecond))
	}
	waitFor(t, 90*time.Second, "the missing topic's first row parked", func() bool { return b.states(t)[ids[0]] == "parked" })
	if d := time.Since(start); d < cfg.UnknownTopicTimeout {
		t.Fatalf("parked after %s, before UnknownTopicTimeout", d)
	}
	if st := b.states(t)[ids[1]]; st != "pending" {
		t.Fatalf("second row of the parked key is %s, want pending behind it", st)
	}
	// Later rows to the missing topic with a new key go straight to parked.
	more := b.write(t, outbox.Record{Topic: missing, Key: []byte("k2"), Value: []byte("later")})
	waitFor(t, 60*time.Second, "a later row for the missing topic parked", func() bool { return b.states(t)[more[0]] == "parked" })
}

// A transaction larger than a relay round is published over several rounds, in write order,
// with a parked row in its middle: the rows of other keys after it flow, the rows of its key
// wait behind it, and they go once the parked row is discarded.
func TestTransactionLargerThanARoundWithAParkedRowInItsMiddle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"max.message.bytes": "4000"})
	cfg := b.config(t)
	cfg.BatchSize = 10
	cfg.KeepPublished = 0 // published rows are deleted, as by default
	r, _ := b.start(t, cfg)
	var recs []outbox.Record
	var want []string
	for i := 0; i < 95; i++ {
		v := fmt.Sprintf("a%02d", i)
		recs = append(recs, outbox.Record{Topic: topic, Key: []byte("a"), Value: []byte(v)})
		want = append(want, v)
		if i == 40 {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte("b"), Value: bytes.Repeat([]byte("x"), 8000)})
		}
		if i > 40 && i%10 == 0 {
			recs = append(recs, outbox.Record{Topic: topic, Key: []byte("b"), Value: []byte(fmt.Sprintf("b%02d", i))})
		}
	}
	ids := b.write(t, recs...)
	waitFor(t, 30*time.Second, "the 95 rows of key a published", func() bool { return r.Stats().Published >= 95 })
	var got []string
	for _, m := range readAll(t, b.brokers, topic) {
		got = append(got, string(m.Value))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published %v,\nwant %v (key a in write order, nothing of key b)", got, want)
	}
	parked, err := b.w.Parked(context.Background(), b.pool, 10)
	if err != nil || len(parked) != 1 || parked[0].Waiting != 5 {
		t.Fatalf("Parked() = %+v, %v; want the large row with the 5 rows of key b waiting", parked, err)
	}
	err = pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.DiscardTx(context.Background(), tx, parked[0].ID, "too large for the topic", "test")
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the rows of key b published after the discard", func() bool { return r.Stats().Published >= 100 })
	got = got[:0]
	for _, m := range readAll(t, b.brokers, topic) {
		got = append(got, string(m.Value))
	}
	if tail := strings.Join(got[95:], ","); tail != "b50,b60,b70,b80,b90" {
		t.Fatalf("after the discard published %s, want b50,b60,b70,b80,b90", tail)
	}
	if len(ids) != 101 {
		t.Fatalf("wrote %d rows, want 101", len(ids))
	}
}

// A row parked because its topic was missing, released right after the topic is created, is
// published: the relay asks the broker again before it parks for a missing topic, instead of
// trusting what it learnt up to a second before (a fresh-eyes attack: released 3 ms after
// kafka-topics --create, the row was parked again, "missing for 13s", 3 times of 3).
func TestAReleaseRightAfterTheMissingTopicIsCreatedPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	missing := testenv.UniqueName(t, "kafkatx-test-created-", 200)
	cfg := b.config(t)
	cfg.UnknownTopicTimeout = time.Second
	cfg.PollInterval = 100 * time.Millisecond
	r, _ := b.start(t, cfg)
	ids := b.write(t, outbox.Record{Topic: missing, Key: []byte("k"), Value: []byte("late topic")})
	waitFor(t, 60*time.Second, "the row parked", func() bool { return b.states(t)[ids[0]] == "parked" })
	// Rows of a new key keep the relay's view of the topic fresh (checked every round).
	for i := range 5 {
		more := b.write(t, outbox.Record{Topic: missing, Key: []byte(fmt.Sprint("k", i)), Value: []byte("later")})
		waitFor(t, 60*time.Second, "a later row parked", func() bool { return b.states(t)[more[0]] == "parked" })
	}
	testenv.NamedTopic(t, b.brokers, missing, 1, nil)
	if err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.w.ReleaseTx(context.Background(), tx, ids[0], "topic created", "test")
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the released row published or parked again", func() bool {
		st := b.states(t)[ids[0]]
		return st == "published" || st == "parked"
	})
	if st := b.states(t)[ids[0]]; st != "published" {
		t.Fatalf("the row released after its topic was created is %s, want published (relay stats %+v)", st, r.Stats())
	}
}

// A topic deleted while the relay knows it is a missing topic like any other: its rows wait
// aside (re-checked every second) while other topics flow, and are parked after
// UnknownTopicTimeout, one a key, the rest of each key waiting behind it. A fresh-eyes
// attack: the healthy topic's row waited 24 s (librdkafka held the deleted topic's records),
// then every record of the deleted topic was parked on its own ("Local: Unknown partition").
func TestATopicDeletedWhileKnownIsAMissingTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gone := testenv.Topic(t, b.brokers, 1)
	other := testenv.Topic(t, b.brokers, 1)
	cfg := b.config(t)
	cfg.UnknownTopicTimeout = 5 * time.Second
	cfg.PollInterval = 100 * time.Millisecond
	b.start(t, cfg)
	first := b.write(t, outbox.Record{Topic: gone, Key: []byte("k0"), Value: []byte("before")})
	waitFor(t, 60*time.Second, "the row published while the topic exists", func() bool { return b.states(t)[first[0]] == "published" })
	testenv.DeleteTopic(t, b.brokers, gone)
	var recs []outbox.Record
	for i := range 10 {
		recs = append(recs, outbox.Record{Topic: gone, Key: []byte(fmt.Sprint("k", i%2)), Value: []byte(fmt.Sprint(i))})
	}
	ids := b.write(t, recs...)
	time.Sleep(time.Second)
	start := time.Now()
	ok := b.write(t, outbox.Record{Topic: other, Key: []byte("k"), Value: []byte("elsewhere")})
	waitFor(t, 60*time.Second, "the other topic's row published", func() bool { return b.states(t)[ok[0]] == "published" })
	d := time.Since(start)
	if d > 4*time.Second {
		t.Errorf("the other topic's row waited %s behind the deleted topic's rows; want under 4 s", d.Round(time.Millisecond))
	}
	t.Logf("the other topic's row published %s after it was written", d.Round(time.Millisecond))
	waitFor(t, 90*time.Second, "one row a key parked", func() bool {
		st := b.states(t)
		return st[ids[0]] == "parked" && st[ids[1]] == "parked"
	})
	time.Sleep(2 * time.Second) // a second park would come in the next rounds
	st := b.states(t)
	parked, pending := 0, 0
	for _, id := range ids {
		switch st[id] {
		case "parked":
			parked++
		case "pending":
			pending++
		}
	}
	if parked != 2 || pending != 8 {
		t.Fatalf("the deleted topic's 10 rows of 2 keys: %d parked, %d pending; want 2 (one a key), 8 behind them", parked, pending)
	}
}
