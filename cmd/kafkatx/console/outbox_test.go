package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// The outbox page's data: parked rows released and discarded through the API (a dry run first,
// which changes nothing), each audited with the console's actor; the backlog; the relay's
// leader while a real relay runs, and none once it stopped.
func TestOutboxParkedRowsAndRelayLeader(t *testing.T) {
	t.Parallel()
	f := newSchemaFixture(t)
	pool, ctx := f.pool, context.Background()
	srv := f.server(nil)

	// Two rows the relay parked (the broker refused them for good), one pending behind the first.
	var ids [2]int64
	for i := range ids {
		ids[i] = f.count(`INSERT INTO %s.outbox (topic, key, value) VALUES ($1, 'k', $2) RETURNING id`, f.topic, fmt.Sprintf("v%d", i))
	}
	f.count(`WITH u AS (UPDATE %s.outbox SET state = 'parked', parked_at = now(), last_error = 'Broker: Message size too large' RETURNING 1) SELECT count(*) FROM u`)
	f.count(`INSERT INTO %s.outbox (topic, key, value) VALUES ($1, 'k', 'behind') RETURNING id`, f.topic)
	view := func() OutboxView {
		t.Helper()
		code, body := call(t, nil, "GET", srv.URL+"/api/outbox", f.token, "")
		var v OutboxView
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			t.Fatalf("GET /api/outbox: %d %s", code, body)
		}
		return v
	}
	v := view()
	if len(v.Parked) != 2 || v.Parked[0].ID != ids[0] || v.Parked[0].Waiting != 1 || v.Leader != nil || len(v.Backlog) != 2 {
		t.Fatalf("outbox view %+v: want 2 parked rows, 1 waiting behind, no leader, backlog of pending and parked", v)
	}
	state := func(id int64) string { return f.str(`SELECT state FROM %s.outbox WHERE id = $1`, id) }
	code, body := call(t, nil, "POST", fmt.Sprintf("%s/api/outbox/%d/release", srv.URL, ids[0]), f.token, `{"reason":"topic limit raised","dry_run":true}`)
	if code != 200 || !strings.Contains(body, "would be released") || state(ids[0]) != "parked" || f.count(`SELECT count(*) FROM %s.outbox_audit`) != 0 {
		t.Fatalf("release dry run: %d %s, state %s", code, body, state(ids[0]))
	}
	if code, body = call(t, nil, "POST", fmt.Sprintf("%s/api/outbox/%d/release", srv.URL, ids[0]), f.token, `{"reason":"topic limit raised"}`, "X-Kafkatx-Actor", "dave"); code != 200 || state(ids[0]) != "pending" {
		t.Fatalf("release: %d %s, state %s", code, body, state(ids[0]))
	}
	if code, body = call(t, nil, "POST", fmt.Sprintf("%s/api/outbox/%d/discard", srv.URL, ids[1]), f.token, `{"reason":"obsolete"}`); code != 200 || state(ids[1]) != "discarded" {
		t.Fatalf("discard: %d %s, state %s", code, body, state(ids[1]))
	}
	if code, _ = call(t, nil, "POST", fmt.Sprintf("%s/api/outbox/%d/discard", srv.URL, ids[1]), f.token, `{"reason":"again"}`); code != http.StatusNotFound {
		t.Fatalf("discard of a row no longer parked: %d, want 404", code)
	}
	if a := f.str(`SELECT actor FROM %s.outbox_audit WHERE outbox_row = $1 AND action = 'release'`, ids[0]); !strings.HasPrefix(a, "dave via console") {
		t.Fatalf("release audit actor %q", a)
	}
	if v = view(); len(v.Parked) != 0 || len(v.Audit) != 2 {
		t.Fatalf("after release and discard: %d parked, %d audit rows", len(v.Parked), len(v.Audit))
	}

	// A logical replication slot (what a WAL-mode outbox reads) is listed with its health. A
	// temporary slot: it goes with the session that made it.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slot := strings.ReplaceAll(testenv.UniqueName(t, "kafkatx_console_", 60), "-", "_")
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding', true)`, slot); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	found := false
	for _, sl := range view().Slots {
		if sl.Name == slot {
			found = sl.Plugin == "test_decoding" && sl.ConfirmedFlushLSN != "" && sl.LagBytes >= 0
		}
	}
	conn.Hijack().Close(ctx) // ends the session, and the temporary slot with it
	if !found {
		t.Fatalf("slot %s not listed with its plugin and LSN: %+v", slot, view().Slots)
	}

	// A real relay: it leads (the console names its session) and publishes the backlog.
	r, err := relay.New(pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": f.brokers}, Schema: f.schema, Logger: zap.NewNop(),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for v = view(); v.Leader == nil || len(v.Backlog) != 0; v = view() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("with a relay running: leader %+v, backlog %+v", v.Leader, v.Backlog)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v.Leader.PID == 0 {
		t.Fatalf("leader %+v", v.Leader)
	}
	cancel()
	<-done
	for v = view(); v.Leader != nil; v = view() {
		if time.Now().After(deadline) {
			t.Fatalf("the relay stopped but the console still names leader %+v", v.Leader)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The outbox page's backlog counts the records of packed rows (outbox.Writer.Pack), not the
// rows, beside plain rows.
func TestOutboxBacklogCountsPackedRecords(t *testing.T) {
	t.Parallel()
	f := newSchemaFixture(t)
	ctx := context.Background()
	srv := f.server(nil)
	var recs []outbox.Record
	for i := 0; i < 12; i++ {
		recs = append(recs, outbox.Record{Topic: f.topic, Key: []byte(fmt.Sprint(i)), Value: []byte("v")})
	}
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := (outbox.Writer{Schema: f.schema, Pack: true}).WriteTx(ctx, tx, recs...); err != nil {
			return err
		}
		_, err := (outbox.Writer{Schema: f.schema}).WriteTx(ctx, tx, recs[:3]...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	code, body := call(t, nil, "GET", srv.URL+"/api/outbox", f.token, "")
	var v OutboxView
	if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
		t.Fatalf("GET /api/outbox: %d %s", code, body)
	}
	got := map[string]int64{}
	for _, b := range v.Backlog {
		got[b.State] += b.Rows
	}
	if len(got) != 2 || got["packed"] != 12 || got["pending"] != 3 {
		t.Fatalf("backlog %+v; want 12 records packed and 3 pending", v.Backlog)
	}
}
