package relay

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// bigKey returns n incompressible bytes: PostgreSQL compresses an index entry before it
// checks its size, so a repeated byte would fit.
func bigKey(t testing.TB, n int) []byte {
	k := make([]byte, n)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// Issue 48: a record with a 3,008-byte key refused for good (its topic does not exist) parks
// like any refused record, and the record written beside it, in the same transaction and so
// in the same mark, and a record written later are each published once and marked. Before,
// the park's UPDATE failed on the parked rows' index ("index row size 3032 exceeds btree
// version 4 maximum 2704", SQLSTATE 54000), the mark of the whole round with it: the big row
// stayed pending where no operator command sees it, and no row was marked any more (a
// delivered one was published again and again).
func TestBigKeyParksAndOtherRowsArePublishedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	missing := testenv.UniqueName(t, "kafkatx-test-missing-", 200)
	cfg := b.config(t)
	cfg.UnknownTopicTimeout = time.Second
	r, _ := b.start(t, cfg)
	key := bigKey(t, 3008)
	ids := b.write(t,
		outbox.Record{Topic: missing, Key: key, Value: []byte("big key")},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("beside")},
	)
	waitFor(t, 20*time.Second, "the big key's row parked", func() bool { return b.states(t)[ids[0]] == "parked" })
	later := b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("later")})
	waitFor(t, 20*time.Second, "the other rows marked published", func() bool {
		st := b.states(t)
		return st[ids[1]] == "published" && st[later[0]] == "published"
	})
	time.Sleep(time.Second) // rounds in which a row left pending would be published again
	var got []string
	for _, m := range readAll(t, b.brokers, topic) {
		got = append(got, string(m.Value))
	}
	if strings.Join(got, ",") != "beside,later" {
		t.Fatalf("the topic holds %q, want each row once: beside,later", got)
	}
	parked, err := b.w.Parked(context.Background(), b.pool, 10)
	if err != nil || len(parked) != 1 || parked[0].ID != ids[0] || parked[0].Topic != missing {
		t.Fatalf("Parked() = %+v, %v; want the big key's row", parked, err)
	}
	// A later row of the parked key waits behind it (the lookup by the key's hash finds it).
	behind := b.write(t, outbox.Record{Topic: missing, Key: key, Value: []byte("behind")},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("last")})
	waitFor(t, 20*time.Second, "the last row published", func() bool { return b.states(t)[behind[1]] == "published" })
	time.Sleep(time.Second)
	if st := b.states(t)[behind[0]]; st != "pending" {
		t.Fatalf("the row behind the parked big key is %s, want pending", st)
	}
	if parked, err := b.w.Parked(context.Background(), b.pool, 10); err != nil || len(parked) != 1 || parked[0].Waiting != 1 {
		t.Fatalf("Parked() = %+v, %v; want the big key's row with 1 row waiting", parked, err)
	}
	if err := r.Ready(context.Background()); err != nil {
		t.Fatalf("Ready = %v, want nil", err)
	}
}

// A mark PostgreSQL refuses because of one row (here a check constraint that refuses to park
// the rows of one topic) does not hold the other rows of its round: they are marked, the
// refused row stays pending, and Ready names it. Before, the whole mark failed, was retried,
// then carried into every later mark, so no row was marked any more.
func TestARefusedMarkOfOneRowDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 1)
	missing := testenv.UniqueName(t, "kafkatx-test-missing-", 200)
	if _, err := b.pool.Exec(context.Background(), `ALTER TABLE `+b.t.Outbox+` ADD CONSTRAINT test_refuse_park
		CHECK (state <> 'parked' OR topic <> '`+missing+`')`); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t)
	cfg.UnknownTopicTimeout = time.Second
	r, _ := b.start(t, cfg)
	ids := b.write(t,
		outbox.Record{Topic: missing, Key: []byte("m"), Value: []byte("unparkable")},
		outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("beside")},
	)
	waitFor(t, 20*time.Second, "Ready naming the row it cannot park", func() bool {
		err := r.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "test_refuse_park")
	})
	later := b.write(t, outbox.Record{Topic: topic, Key: []byte("k"), Value: []byte("later")})
	waitFor(t, 20*time.Second, "the other rows marked published", func() bool {
		st := b.states(t)
		return st[ids[1]] == "published" && st[later[0]] == "published"
	})
	time.Sleep(time.Second)
	var got []string
	for _, m := range readAll(t, b.brokers, topic) {
		got = append(got, string(m.Value))
	}
	if strings.Join(got, ",") != "beside,later" {
		t.Fatalf("the topic holds %q, want each row once: beside,later", got)
	}
	if st := b.states(t)[ids[0]]; st != "pending" {
		t.Fatalf("the row PostgreSQL refused to park is %s, want pending", st)
	}
	if err := r.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "could not be parked") {
		t.Fatalf("Ready = %v, want an error naming the row that could not be parked", err)
	}
}
