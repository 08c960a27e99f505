// Command airflowstandin is a stand-in for Airflow 3's REST API v2 in the throughput
// benchmark (scripts/bench-peers): it answers in constant time, so dagtrigger's own cost per
// event is what is measured, not Airflow's. Not an Airflow: it keeps the created runs in
// memory only.
//
//	airflowstandin -listen 127.0.0.1:0 -addr-file F   serve until SIGTERM; the bound address is
//	                                                    written to F; at exit one JSON line
//	                                                    {"created":N,"conflicts":N,"bad":N} on stdout
//	airflowstandin -produce N -topic T -brokers B       produce N Debezium create events (JSON
//	                                                    converter, no schema) to T and exit,
//	                                                    printing {"produced":N,"avg_message_bytes":B}
//
// Served: GET /api/v2/dags/{dag_id} (is_paused false) and POST /api/v2/dags/{dag_id}/dagRuns
// (the first create of a dag_run_id is 200, a later one 409 Conflict, as Airflow answers);
// everything else is 404.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/examples/internal/topics"
)

type standin struct {
	mu                      sync.Mutex
	runs                    map[string]struct{}
	created, conflicts, bad int
}

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v2/dags/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	dag, tail, _ := strings.Cut(rest, "/")
	switch {
	case r.Method == http.MethodGet && tail == "":
		fmt.Fprintf(w, `{"dag_id":%q,"is_paused":false}`, dag)
	case r.Method == http.MethodPost && tail == "dagRuns":
		var body struct {
			DAGRunID string `json:"dag_run_id"`
		}
		raw, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		if json.Unmarshal(raw, &body) != nil || body.DAGRunID == "" {
			s.bad++
			http.Error(w, `{"detail":"bad request"}`, http.StatusBadRequest)
			return
		}
		if _, dup := s.runs[body.DAGRunID]; dup {
			s.conflicts++
			http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
			return
		}
		s.runs[body.DAGRunID] = struct{}{}
		s.created++
		fmt.Fprintf(w, `{"dag_id":%q,"dag_run_id":%q,"state":"queued"}`, dag, body.DAGRunID)
	default:
		http.NotFound(w, r)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	addrFile := flag.String("addr-file", "", "file to write the bound host:port to")
	n := flag.Int("produce", 0, "instead of serving: produce this many Debezium create events")
	topic := flag.String("topic", "", "topic for -produce")
	brokers := flag.String("brokers", os.Getenv("KAFKA_BOOTSTRAP_SERVERS"), "bootstrap servers for -produce")
	flag.Parse()
	if *n > 0 {
		if err := produce(*brokers, *topic, *n); err != nil {
			fmt.Fprintln(os.Stderr, "airflowstandin:", err)
			os.Exit(1)
		}
		return
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "airflowstandin:", err)
		os.Exit(1)
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "airflowstandin:", err)
			os.Exit(1)
		}
	}
	s := &standin{runs: map[string]struct{}{}}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "airflowstandin:", err)
		os.Exit(1)
	}
	s.mu.Lock()
	fmt.Printf("{\"created\":%d,\"conflicts\":%d,\"bad\":%d}\n", s.created, s.conflicts, s.bad)
	s.mu.Unlock()
}

// produce creates topic (3 partitions) and sends n Debezium create events of a customers
// table (key {"id":i}), as a
// PostgreSQL connector with the JSON converter and schemas off writes them.
func produce(brokers, topic string, n int) error {
	if brokers == "" || topic == "" {
		return fmt.Errorf("-produce needs -brokers and -topic")
	}
	// Three partitions, as examples/orders' topics.
	if err := topics.Ensure(context.Background(), zap.NewNop(), kafka.ConfigMap{"bootstrap.servers": brokers}, []string{topic}, 3, 1, nil, time.Minute); err != nil {
		return err
	}
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers, "enable.idempotence": true, "linger.ms": 5})
	if err != nil {
		return err
	}
	defer p.Close()
	base := time.Now().UnixNano() / 64 * 64
	var bytes int64
	done := make(chan error, 1)
	go func() {
		var first error
		for i := 0; i < n; i++ {
			if m, ok := (<-p.Events()).(*kafka.Message); ok && m.TopicPartition.Error != nil && first == nil {
				first = m.TopicPartition.Error
			}
		}
		done <- first
	}()
	for i := 1; i <= n; i++ {
		msg := &kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key:            fmt.Appendf(nil, `{"id":%d}`, i),
			Value: fmt.Appendf(nil, `{"before":null,"after":{"id":%d,"name":"customer %d"},"source":{"connector":"postgresql","name":"bench","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"c","ts_ms":1790000000000}`,
				i, i, base+int64(i)*64, base/64+int64(i)),
		}
		bytes += int64(len(msg.Key) + len(msg.Value))
		for {
			err := p.Produce(msg, nil)
			if err == nil {
				break
			}
			if kerr, ok := err.(kafka.Error); ok && kerr.Code() == kafka.ErrQueueFull {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("{\"produced\":%d,\"avg_message_bytes\":%d}\n", n, (bytes+int64(n)/2)/int64(n))
	return nil
}
