package kafkatx

import (
	"context"
	"os"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A readiness note is listed in Readiness.Notes and never changes Ready; a note with nothing
// to say is not listed. (A consumer that does not run: not ready for that reason alone.)
func TestReadinessNotesNeverChangeReady(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL")) // lazy: connects at the first use
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := NewConsumer(pool, func(context.Context, pgx.Tx, *Message) error { return nil }, &Config{
		Kafka: kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "group.id": "notes"}, Topics: []string{"notes"}})
	if err != nil {
		t.Fatal(err)
	}
	before := c.Readiness(context.Background())
	c.AddReadinessNote("airflow", func(context.Context) string { return "DAG d is paused" })
	c.AddReadinessNote("quiet", func(context.Context) string { return "" })
	after := c.Readiness(context.Background())
	if len(after.Notes) != 1 || after.Notes[0] != (ReadinessNote{Name: "airflow", Note: "DAG d is paused"}) {
		t.Fatalf("Notes %+v: want the airflow note alone", after.Notes)
	}
	if after.Ready != before.Ready || len(after.Reasons) != len(before.Reasons) {
		t.Fatalf("a note changed readiness: ready %t → %t, reasons %q → %q", before.Ready, after.Ready, before.Reasons, after.Reasons)
	}
}
