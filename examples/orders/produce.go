package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/examples/orders/order"
)

type produceSummary struct {
	Produced int `json:"produced"`
	Valid    int `json:"valid"`
	Poison   int `json:"poison"`
	Crash    int `json:"crash"`
	// TotalCents is the valid orders' sum, exact at any size (an int64 wrapped negative past
	// 9.2e18 cents: a false mismatch for whoever checks the totals against this line).
	TotalCents *big.Int `json:"total_cents"`
}

type record struct {
	key, value []byte
	crash      bool // a crash pill: sent with the header order.CrashPillHeader
}

// maxLineBytes bounds a --produce line: Kafka's default record limit is about 1 MB (librdkafka
// message.max.bytes 1,000,000; the broker's message.max.bytes 1,048,588), and the line's dead
// letter carries kafkatx.dlq.* headers on top, which must fit too or the relay parks it.
const maxLineBytes = 900_000

// produce sends the --produce file's lines or --generate's synthetic orders with an
// idempotent producer (acks=all) and waits for every delivery report.
func produce(ctx context.Context, base kafka.ConfigMap, o options) (produceSummary, error) {
	var recs []record
	if o.produceFile != "" {
		f, err := os.Open(o.produceFile)
		if err != nil {
			return produceSummary{}, fmt.Errorf("--produce: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSuffix(sc.Text(), "\r")
			if strings.TrimSpace(line) == "" {
				continue
			}
			if len(line) > maxLineBytes {
				// Refused before anything is produced: a half-produced file would be replayed
				// whole after the fix, dead-lettering its bad lines twice.
				f.Close()
				return produceSummary{}, fmt.Errorf("--produce %s: line %d is %d bytes, more than %d (Kafka's 1 MB record limit, less room for its dead letter's headers); nothing was produced",
					o.produceFile, n, len(line), maxLineBytes)
			}
			recs = append(recs, record{key: jsonOrderKey([]byte(line)), value: []byte(line)})
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return produceSummary{}, fmt.Errorf("--produce %s: %w", o.produceFile, err)
		}
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	customers := []string{"c-001", "c-002", "c-003", "c-004", "c-005", "c-006", "c-007", "c-008", "c-009", "c-010"}
	items := []string{"widget", "gadget", "doohickey", "thingamajig"}
	for i := 1; i <= o.generate; i++ {
		if o.poisonEvery > 0 && i%o.poisonEvery == 0 {
			recs = append(recs, record{value: []byte(fmt.Sprintf("poison pill %s-%d: not JSON", run, i))})
			continue
		}
		id := fmt.Sprintf("GEN-%s-%d", run, i)
		crash := o.crashEvery > 0 && i%o.crashEvery == 0
		if crash {
			id = fmt.Sprintf("CRASH-%s-%d", run, i)
		}
		v := fmt.Sprintf(`{"order_id":%q,"customer":%q,"item":%q,"quantity":%d,"price":%d.%02d}`,
			id, customers[i%len(customers)], items[i%len(items)], 1+i%5, 1+i%40, (i*7)%100)
		recs = append(recs, record{key: []byte(id), value: []byte(v), crash: crash})
	}

	sum := produceSummary{TotalCents: new(big.Int)}
	for _, r := range recs {
		if r.crash {
			sum.Crash++
			continue
		}
		if o, err := order.Parse(r.value); err == nil {
			sum.Valid++
			sum.TotalCents.Add(sum.TotalCents, big.NewInt(o.TotalCents))
		} else {
			sum.Poison++
		}
	}
	cfg := kafka.ConfigMap{"enable.idempotence": true, "acks": "all", "linger.ms": 5, "go.delivery.reports": true}
	for k, v := range base {
		cfg[k] = v
	}
	p, err := kafka.NewProducer(&cfg)
	if err != nil {
		return sum, fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	reports := make(chan kafka.Event, 1024)
	errs := make(chan error, 1)
	go func() {
		var first error
		for i := 0; i < len(recs); i++ {
			e := <-reports
			if m, ok := e.(*kafka.Message); ok && m.TopicPartition.Error != nil && first == nil {
				first = m.TopicPartition.Error
			}
		}
		errs <- first
	}()
	topic := o.Topic
	for _, r := range recs {
		msg := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny}, Key: r.key, Value: r.value}
		if r.crash {
			msg.Headers = []kafka.Header{{Key: order.CrashPillHeader, Value: []byte("exit 3")}}
		}
		for {
			err := p.Produce(msg, reports)
			if err == nil {
				break
			}
			if kerr, ok := err.(kafka.Error); ok && kerr.Code() == kafka.ErrQueueFull {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return sum, fmt.Errorf("produce: %w", err)
		}
	}
	select {
	case err := <-errs:
		if err != nil {
			return sum, fmt.Errorf("delivery: %w", err)
		}
	case <-ctx.Done():
		return sum, ctx.Err()
	}
	sum.Produced = len(recs)
	return sum, nil
}

// jsonOrderKey returns the order_id of a JSON object line, or nil.
func jsonOrderKey(line []byte) []byte {
	var v struct {
		OrderID *string `json:"order_id"`
	}
	if err := json.Unmarshal(line, &v); err != nil || v.OrderID == nil {
		return nil
	}
	return []byte(*v.OrderID)
}
