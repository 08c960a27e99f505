package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestCaughtUpWithRealOffsets: the check against a real broker's log ends and watermarks in
// PostgreSQL: behind while a partition's watermark is short of its log end, caught up once
// it is not, and never caught up when the broker cannot be asked.
func TestCaughtUpWithRealOffsets(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	topic, group := testenv.Topic(t, brokers, 2), testenv.Group(t)
	testenv.Produce(t, brokers, topic, make([]kafka.Message, 5)) // partition 0: offsets 0..4; partition 1 empty
	o := Options{Pool: pool, Schema: schema, Group: group, Topic: topic, Logger: zaptest.NewLogger(t)}
	check, err := newIdleCheck(o, kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer check.close()
	if ok, why := check.caughtUp(ctx); ok || !strings.Contains(why, "["+"0] no watermark, log 0..5") {
		t.Fatalf("no watermark yet: %v %q", ok, why)
	}
	store := offsetstore.New(schema)
	tp := offsetstore.TP{Topic: topic, Partition: 0}
	if _, _, err := store.Init(ctx, pool, group, tp, 3); err != nil {
		t.Fatal(err)
	}
	if ok, why := check.caughtUp(ctx); ok || !strings.Contains(why, "watermark 3, log end 5") {
		t.Fatalf("watermark 3 of 5: %v %q", ok, why)
	}
	if err := store.Advance(ctx, pool, group, tp, "", 3, 5, -1); err != nil {
		t.Fatal(err)
	}
	if ok, why := check.caughtUp(ctx); !ok {
		t.Fatalf("watermark at the log end: not caught up: %q", why)
	}
	// The broker cannot be asked: not idle, whatever the watermarks say.
	down, err := newIdleCheck(o, kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer down.close()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if ok, why := down.caughtUp(cctx); ok || !strings.Contains(why, "cannot ask the broker") {
		t.Fatalf("broker unreachable: %v %q", ok, why)
	}
}

// TestNoAssignmentWithKafkaDownIsAnError: a binary that gives up waiting for an assignment
// because Kafka cannot be reached returns an error (the examples exit 1 with it), not nil.
func TestNoAssignmentWithKafkaDownIsAnError(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	c, err := kafkatx.NewConsumer(pool, func(context.Context, pgx.Tx, *kafkatx.Message) error { return nil }, &kafkatx.Config{
		Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, Topics: []string{"t"}, Schema: schema, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	err = Run(ctx, Options{Pool: pool, Consumer: c, Brokers: "127.0.0.1:1", Schema: schema, Group: "g", Topic: "t",
		ExitWhenIdle: time.Second, NoAssignmentTimeout: 4 * time.Second, AuthFailureExit: -1, Logger: log})
	var na *NoAssignmentError
	if !errors.As(err, &na) || na.KafkaError == "" {
		t.Fatalf("Run: %v, want a *NoAssignmentError naming the Kafka error", err)
	}
}
