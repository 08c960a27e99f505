package walrelay

import (
	"bytes"
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/outbox"
)

// Issue 48: a record with a 3,008-byte (incompressible) key for a topic that does not exist
// is parked, listed by `kafkatx outbox parked`, and the records beside it and after it are
// published once. Before, storing the parked row failed on the parked rows' index ("index row
// size 3032 exceeds btree version 4 maximum 2704", SQLSTATE 54000): the stream stopped at the
// record and reconnected every RetryInterval for ever, publishing nothing after it.
func TestBigKeyRecordIsParkedAndTheRestPublishedOnce(t *testing.T) {
	b := newBundle(t)
	ctx := context.Background()
	key := make([]byte, 3008)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	missing := "no-such-topic-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	recs := []outbox.Record{
		{Topic: missing, Key: key, Value: []byte("big key")},
		{Topic: b.topic, Key: []byte("k"), Value: []byte("beside")},
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	b.write(t, "after", 5, 2)
	want := append([]string{"beside"}, values("after", 5)...)
	r, _, _ := b.start(t, b.config(t))
	onceEach(t, readAll(t, b.brokers, b.topic, len(want), 3*time.Second, 60*time.Second), want)
	parked, err := outbox.Writer{}.Parked(ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].Topic != missing || !bytes.Equal(parked[0].Key, key) || !strings.Contains(parked[0].LastError, "does not exist") {
		t.Fatalf("parked rows %+v: want the big key's record, for a missing topic", parked)
	}
	if err := r.Ready(ctx); err != nil {
		t.Fatalf("Ready = %v, want nil", err)
	}
	if s := r.Stats(); s.Parked != 1 || !s.Streaming {
		t.Fatalf("Stats %+v: want 1 parked, streaming", s)
	}
}

// A record PostgreSQL refuses to store as a parked row stops the stream at it (the relay never
// skips a record), and every new stream stops there again. Ready names the record and the
// refusal once that has lasted NotReadyAfter, however often the stream starts again (before,
// each new stream made the relay ready again for a moment). Once the row can be stored, the
// record is parked and the rest published.
func TestUnstorableParkedRowIsNamedByReady(t *testing.T) {
	b := newBundle(t)
	ctx := context.Background()
	missing := "no-such-topic-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := b.pool.Exec(ctx, `ALTER TABLE kafkatx.outbox ADD CONSTRAINT test_refuse_park CHECK (state <> 'parked' OR topic <> '`+missing+`')`); err != nil {
		t.Fatal(err)
	}
	recs := []outbox.Record{{Topic: missing, Key: []byte("m"), Value: []byte("unstorable")}, {Topic: b.topic, Key: []byte("k"), Value: []byte("after")}}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { _, err := outbox.WriteTx(ctx, tx, recs...); return err }); err != nil {
		t.Fatal(err)
	}
	r, _, _ := b.start(t, b.config(t))
	deadline := time.Now().Add(NotReadyAfter + 20*time.Second)
	for {
		err := r.Ready(ctx)
		if err != nil && strings.Contains(err.Error(), "test_refuse_park") && strings.Contains(err.Error(), missing) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the record that cannot be parked named", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := b.pool.Exec(ctx, `ALTER TABLE kafkatx.outbox DROP CONSTRAINT test_refuse_park`); err != nil {
		t.Fatal(err)
	}
	onceEach(t, readAll(t, b.brokers, b.topic, 1, 3*time.Second, 60*time.Second), []string{"after"})
	if err := r.Ready(ctx); err != nil {
		t.Fatalf("Ready = %v after the record was parked, want nil", err)
	}
}
