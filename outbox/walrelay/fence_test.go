package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Fencing by transactional.id, both ways: a producer taking the relay's transactional.id (a
// zombie's view) makes the relay's next commit fail; the relay reconnects, fences it in turn
// and publishes on; the zombie's own transaction cannot commit. read_committed sees every
// record once and nothing of the zombie.
func TestZombieFencedByTransactionalID(t *testing.T) {
	t.Parallel() // a database (or cluster), slot and topics of its own
	b := newBundle(t)
	r, _, _ := b.start(t, b.config(t))
	b.write(t, "x", 200, 10)
	for end := time.Now().Add(30 * time.Second); r.Stats().Published < 200 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
	}
	ctx := context.Background()
	z, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": b.brokers, "transactional.id": "kafkatx-wal-" + b.slot, "go.logs.channel.enable": false})
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := z.InitTransactions(ictx); err != nil {
		t.Fatal(err)
	}
	if err := z.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := z.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: 0}, Value: []byte("zombie")}, nil); err != nil {
		t.Fatal(err)
	}
	z.Flush(5000)
	b.write(t, "y", 200, 10)
	for end := time.Now().Add(60 * time.Second); r.Stats().Published < 400 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
	}
	if p := r.Stats().Published; p < 400 {
		t.Fatalf("the relay published %d of 400 after being fenced once", p)
	}
	if err := z.CommitTransaction(ictx); err == nil {
		t.Fatal("the zombie committed its transaction after the relay fenced it")
	}
	onceEach(t, readAll(t, b.brokers, b.topic, 400, 2*time.Second, 60*time.Second), append(values("x", 200), values("y", 200)...))
}
