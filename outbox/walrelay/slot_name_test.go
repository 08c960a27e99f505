package walrelay

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// (A short name: the database is named after the test, and the old rule cut and hashed only
// names past 63 bytes.) Two schemas of one database whose names read alike once made an identifier ("x_y" and
// "x-y": the slot name's readable part) each get a slot of their own, and each relay
// publishes its own schema's events. Before, both got slot kafkatx_<db>_x_y: the first relay
// confirmed the shared slot past the other schema's messages, which it skips, and the second
// relay found nothing — its 200 events lost, silently, exit 0 (found by a fresh-eyes attack).
func TestSchemaSlotsApart(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	brokers := testenv.Brokers(t)
	dsn := testenv.Database(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schemas := []string{"x-y", "x_y"}
	topics := map[string]string{}
	slots := map[string]bool{}
	for _, s := range schemas {
		if _, err := migrations.Apply(ctx, pool, s); err != nil {
			t.Fatal(err)
		}
		if err := outbox.SetMode(ctx, pool, s, outbox.ModeWAL); err != nil {
			t.Fatalf("schema %s: %v", s, err)
		}
		st, err := outbox.ReadSettings(ctx, pool, s)
		if err != nil {
			t.Fatal(err)
		}
		slot := st.Slot
		t.Cleanup(func() {
			for i := 0; i < 50; i++ {
				_, _ = pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
				if _, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		if slots[slot] {
			t.Fatalf("schemas %q share slot %s", schemas, slot)
		}
		slots[slot] = true
		topics[s] = testenv.Topic(t, brokers, 1)
		recs := make([]outbox.Record, 200)
		for i := range recs {
			recs[i] = outbox.Record{Topic: topics[s], Key: []byte("k" + strconv.Itoa(i)), Value: []byte(s + "-" + strconv.Itoa(i))}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Writer{Schema: s}.WriteTx(ctx, tx, recs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// One relay after the other, as in the attack: the first must not consume the second's.
	for _, s := range schemas {
		b := &bundle{brokers: brokers, dsn: dsn, pool: pool, topic: topics[s]}
		b.checkpoint = testenv.TopicWithConfig(t, brokers, 1, map[string]string{"cleanup.policy": "compact"})
		cfg := b.config(t)
		cfg.Schema = s
		_, cancel, done := b.start(t, cfg)
		got := readAll(t, brokers, topics[s], 200, 2*time.Second, 60*time.Second)
		cancel()
		<-done
		done <- nil // start's cleanup reads it again
		if len(got) != 200 {
			t.Fatalf("schema %s: %d of its 200 events published", s, len(got))
		}
	}
}
