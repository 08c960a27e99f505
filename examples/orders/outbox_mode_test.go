package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// --outbox-mode wal on a new schema chooses WAL mode (slot created before anything is
// written): the events and the dead letters are published from the slot, with no outbox row;
// a later run with --outbox-mode table exits 2 with one line naming the stored mode.
func TestOutboxModeWALPublishesEventsAndDeadLettersAndAConflictExits2(t *testing.T) {
	bin := buildOrders(t)
	brokers := testenv.Brokers(t)
	dsn := testenv.Database(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 50; i++ {
			if _, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		pool.Close()
	})
	topic := testenv.Topic(t, brokers, 3)
	events := testenv.Topic(t, brokers, 3)
	dlq := testenv.NamedTopic(t, brokers, topic+".dlq", 3, nil)
	args := []string{"--brokers", brokers, "--database-url", dsn, "--topic", topic, "--group", testenv.Group(t), "--events-topic", events}
	r := runOrders(t, bin, 120*time.Second, append(args, "--generate", "50", "--poison-every", "10", "--outbox-mode", "wal", "--exit-when-idle", "2s")...)
	if r.code != 0 {
		t.Fatalf("orders --outbox-mode wal: exit %d\n%s", r.code, r.stderr)
	}
	if got := len(testenv.Read(t, brokers, events, 45)); got != 45 {
		t.Fatalf("%d events", got)
	}
	if got := len(testenv.Read(t, brokers, dlq, 5)); got != 5 {
		t.Fatalf("%d dead letters", got)
	}
	s, err := outbox.ReadSettings(context.Background(), pool, "kafkatx")
	if err != nil || s.Mode != outbox.ModeWAL || !s.Chosen {
		t.Fatalf("stored mode %+v (%v), want wal, chosen", s, err)
	}
	var rows int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE schemaname = 'kafkatx' AND relname = 'outbox'`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows inserted into kafkatx.outbox (%v), want 0", rows, err)
	}
	r = runOrders(t, bin, 60*time.Second, append(args, "--outbox-mode", "table", "--exit-when-idle", "1s")...)
	last := strings.TrimSpace(r.stderr)
	if i := strings.LastIndex(last, "\n"); i >= 0 {
		last = last[i+1:]
	}
	if r.code != 2 || !strings.Contains(last, "outbox mode conflict") || !strings.Contains(last, "wal mode") {
		t.Fatalf("orders --outbox-mode table on a WAL schema: exit %d, last line %q; want 2 and the conflict", r.code, last)
	}
}
