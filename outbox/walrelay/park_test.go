package walrelay

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// A record the broker refuses (over the topic's max.message.bytes) aborts its Kafka
// transaction; the relay publishes the same transactions again without it and parks it where
// `kafkatx outbox parked` lists it; a record for a topic that does not exist is parked without
// producing. Every other record, before and after them and of the same key, is published once.
func TestRefusedRecordsAreParkedAndTheRestPublishedOnce(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	b.topic = testenv.TopicWithConfig(t, b.brokers, 3, map[string]string{"max.message.bytes": "2000"})
	ctx := context.Background()
	var recs []outbox.Record
	var want []string
	for i := 0; i < 30; i++ {
		v := "v" + strconv.Itoa(i)
		switch i {
		case 10:
			v = "big" + strings.Repeat("x", 5000)
		case 20:
			recs = append(recs, outbox.Record{Topic: "no-such-topic-" + strconv.FormatInt(time.Now().UnixNano(), 36), Key: []byte("k0"), Value: []byte("lost?")})
		}
		recs = append(recs, outbox.Record{Topic: b.topic, Key: []byte("k" + strconv.Itoa(i%3)), Value: []byte(v)})
		if i != 10 {
			want = append(want, v)
		}
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	b.write(t, "after", 20, 3)
	want = append(want, values("after", 20)...)
	r, _, _ := b.start(t, b.config(t))
	onceEach(t, readAll(t, b.brokers, b.topic, len(want), 3*time.Second, 90*time.Second), want)
	parked, err := outbox.Writer{}.Parked(ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var big, missing bool
	for _, p := range parked {
		big = big || (p.Topic == b.topic && bytes.HasPrefix(p.Value, []byte("big")) && p.LastError != "")
		missing = missing || (strings.HasPrefix(p.Topic, "no-such-topic-") && strings.Contains(p.LastError, "does not exist"))
	}
	if len(parked) != 2 || !big || !missing {
		t.Fatalf("parked rows %+v: want the oversized record and the one for a missing topic, with their reasons", parked)
	}
	if s := r.Stats(); s.Parked != 2 {
		t.Fatalf("Stats.Parked %d, want 2", s.Parked)
	}
}

// The broker refuses a whole batch for one record in it (a record without a key on a
// compacted topic: INVALID_RECORD for every record of the batch). The relay publishes the
// batch's records one at a time to find the one refused, parks only that one, and publishes
// the others once.
func TestRefusedBatchIsBisectedToTheRecordAtFault(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	b.topic = testenv.TopicWithConfig(t, b.brokers, 1, map[string]string{"cleanup.policy": "compact"})
	ctx := context.Background()
	var recs []outbox.Record
	var want []string
	for i := 0; i < 21; i++ {
		if i == 10 {
			recs = append(recs, outbox.Record{Topic: b.topic, Key: nil, Value: []byte("no-key")})
			continue
		}
		v := "v" + strconv.Itoa(i)
		recs = append(recs, outbox.Record{Topic: b.topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte(v)})
		want = append(want, v)
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	r, _, _ := b.start(t, b.config(t))
	onceEach(t, readAll(t, b.brokers, b.topic, len(want), 3*time.Second, 90*time.Second), want)
	parked, err := outbox.Writer{}.Parked(ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || string(parked[0].Value) != "no-key" || parked[0].Key != nil {
		t.Fatalf("parked %+v: want only the record without a key", parked)
	}
	if s := r.Stats(); s.Parked != 1 {
		t.Fatalf("Stats.Parked %d, want 1", s.Parked)
	}
}
