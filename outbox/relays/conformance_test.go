package relays_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/outbox/relays"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// modes are the outbox modes the conformance suite runs; a new mode is added here.
var modes = []outbox.Mode{outbox.ModeTable, outbox.ModeWAL}

// TestConformanceSameRecordsSameOutcomeInEveryMode is the one suite both relays run against
// the real broker (issue 31): in each mode, one transaction writes two good records around a
// record for a missing topic, one naming a partition its topic does not have (refused), one
// over its topic's max.message.bytes (oversized) and one with a nil key for a compacted
// topic. In every mode the four are parked — the same four, with the same reason — and the
// two good ones are published, in order. Before the shared publish core, the nil key on a
// compacted topic was parked in table mode and refused by the broker (aborting the Kafka
// transaction) in WAL mode. Table mode runs twice: with plain rows and with the records in one
// packed row (outbox.Writer.Pack), whose refused records are parked alone as plain rows.
func TestConformanceSameRecordsSameOutcomeInEveryMode(t *testing.T) {
	brokers := testenv.Brokers(t)
	dsn := testenv.Database(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		pool.Close()
	})
	reasons := map[string]map[string]string{}
	type variant struct {
		name string
		mode outbox.Mode
		pack bool // outbox.Writer.Pack: the records in one packed row (table mode)
	}
	var variants []variant
	for _, mode := range modes {
		variants = append(variants, variant{string(mode), mode, false})
	}
	variants = append(variants, variant{"table-packed", outbox.ModeTable, true})
	for _, v := range variants {
		mode := v.mode
		t.Run(v.name, func(t *testing.T) {
			schema := testenv.UniqueName(t, "c_", 40)
			if _, err := migrations.Apply(ctx, pool, schema); err != nil {
				t.Fatal(err)
			}
			if mode != outbox.ModeTable {
				if err := outbox.SetMode(ctx, pool, schema, mode); err != nil {
					t.Fatal(err)
				}
			}
			good := testenv.Topic(t, brokers, 1)
			compacted := testenv.TopicWithConfig(t, brokers, 1, map[string]string{"cleanup.policy": "compact"})
			small := testenv.TopicWithConfig(t, brokers, 1, map[string]string{"max.message.bytes": "2000"})
			missing := "kafkatx-conformance-missing-" + schema
			seven := int32(7)
			recs := []outbox.Record{
				{Topic: good, Key: []byte("k"), Value: []byte("first")},
				{Topic: missing, Key: []byte("k"), Value: []byte("missing topic")},
				{Topic: good, Key: []byte("p"), Value: []byte("no such partition"), Partition: &seven},
				{Topic: small, Key: []byte("k"), Value: []byte(strings.Repeat("x", 10_000))},
				{Topic: compacted, Key: nil, Value: []byte("nil key")},
				{Topic: good, Key: []byte("k2"), Value: []byte("second")},
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Writer{Schema: schema, Pack: v.pack}.WriteTx(ctx, tx, recs...)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			rl, err := relays.New(pool, relays.Options{Mode: mode, Kafka: kafka.ConfigMap{"bootstrap.servers": brokers}, Schema: schema,
				Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
				Table:  relay.Config{UnknownTopicTimeout: time.Second, PollInterval: 100 * time.Millisecond},
				WAL:    walrelay.Config{CheckpointTopic: testenv.TopicWithConfig(t, brokers, 1, map[string]string{"cleanup.policy": "compact"}), RetryInterval: 100 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- rl.Run(runCtx) }()
			defer func() { stop(); <-done }()

			got := testenv.Read(t, brokers, good, 2)
			if string(got[0].Value) != "first" || string(got[1].Value) != "second" {
				t.Errorf("published %q, %q; want first, second", got[0].Value, got[1].Value)
			}
			parked := map[string]string{}
			deadline := time.Now().Add(60 * time.Second)
			for len(parked) < 4 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				rows, err := pool.Query(ctx, `SELECT convert_from(value, 'UTF8'), coalesce(last_error, '') FROM `+pgx.Identifier{schema, "outbox"}.Sanitize()+` WHERE state = 'parked'`)
				if err != nil {
					t.Fatal(err)
				}
				parked = map[string]string{}
				for rows.Next() {
					var v, e string
					if err := rows.Scan(&v, &e); err != nil {
						t.Fatal(err)
					}
					if len(v) > 20 {
						v = "oversized"
					}
					parked[v] = e
				}
				if rows.Err() != nil {
					t.Fatal(rows.Err())
				}
			}
			for _, want := range []string{"missing topic", "no such partition", "oversized", "nil key"} {
				if _, ok := parked[want]; !ok {
					t.Errorf("%s mode: the %q record is not parked (parked: %v)", mode, want, parked)
				}
			}
			if len(parked) != 4 {
				t.Errorf("%s mode: %d records parked, want 4: %v", mode, len(parked), parked)
			}
			if e := parked["nil key"]; !strings.Contains(e, "nil key") || !strings.Contains(e, "compact") {
				t.Errorf("%s mode: the nil-key record's reason %q does not name the compacted topic's rule", mode, e)
			}
			reasons[v.name] = parked
		})
	}
	// One reason, written once (publish.ErrNilKeyOnCompactedTopic), whichever mode parked it.
	if a, b, c := reasons["table"]["nil key"], reasons["wal"]["nil key"], reasons["table-packed"]["nil key"]; a != b || a != c {
		t.Errorf("the nil-key reason differs by mode: table %q, WAL %q, table with packed rows %q", a, b, c)
	}
}
