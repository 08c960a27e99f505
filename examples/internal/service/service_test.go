package service

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// /healthz answers while the process runs; /readyz is 200 once the consumer joined its group
// and 503 with a JSON reason naming a subscribed topic that does not exist.
func TestHealthAndReadinessEndpoints(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		missing bool
	}{{"ready", false}, {"missing topic", true}} {
		t.Run(tc.name, func(t *testing.T) {
			topic := testenv.Topic(t, brokers, 1)
			topics := []string{topic}
			if tc.missing {
				topics = append(topics, topic+"-missing")
			}
			reg := prometheus.NewRegistry()
			log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
			c, err := kafkatx.NewConsumer(pool, func(context.Context, pgx.Tx, *kafkatx.Message) error { return nil }, &kafkatx.Config{
				Kafka:  kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": testenv.Group(t), "session.timeout.ms": 6000},
				Topics: topics, Schema: schema, Logger: log, Registerer: reg,
			})
			if err != nil {
				t.Fatal(err)
			}
			addr := testenv.FreeAddr(t)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- Run(runCtx, Options{Pool: pool, Consumer: c, Brokers: brokers, Schema: schema, Logger: log, Registry: reg, MetricsAddr: addr})
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			want := http.StatusOK
			if tc.missing {
				want = http.StatusServiceUnavailable
			}
			var code int
			var body string
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				code, body = testenv.Get(addr, "/readyz")
				if code == want && (!tc.missing || strings.Contains(body, topic+"-missing")) && strings.Contains(body, `"joined":true`) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			var rd kafkatx.Readiness
			if err := json.Unmarshal([]byte(body), &rd); err != nil || code != want {
				t.Fatalf("/readyz: %d %q (%v), want %d", code, body, err, want)
			}
			if tc.missing && (rd.Ready || len(rd.Reasons) == 0 || len(rd.MissingTopics) != 1) {
				t.Fatalf("/readyz with a missing topic: %s", body)
			}
			if code, body := testenv.Get(addr, "/healthz"); code != http.StatusOK {
				t.Fatalf("/healthz: %d %q", code, body)
			}
			if code, body := testenv.Get(addr, "/metrics"); code != http.StatusOK || !strings.Contains(body, "kafkatx_") {
				t.Fatalf("/metrics: %d", code)
			}
		})
	}
}

// A Kafka authentication failure that persists ends Run with an *AuthError (the library
// reports it in Readiness and retries; the binary decides). Here: SASL against the dev broker's
// plaintext listener, whose handshake the broker refuses.
func TestPersistentKafkaAuthenticationFailureEndsRun(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	brokers := testenv.Brokers(t)
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))
	c, err := kafkatx.NewConsumer(pool, func(context.Context, pgx.Tx, *kafkatx.Message) error { return nil }, &kafkatx.Config{
		Kafka: kafka.ConfigMap{"bootstrap.servers": brokers, "group.id": testenv.Group(t),
			"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
		Topics: []string{"auth-check"}, Schema: schema, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	start := time.Now()
	err = Run(runCtx, Options{Pool: pool, Consumer: c, Brokers: brokers, Schema: schema, Logger: log, AuthFailureExit: 3 * time.Second})
	var ae *AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("Run: %v, want an *AuthError", err)
	}
	if d := time.Since(start); d < 3*time.Second || d > 60*time.Second {
		t.Fatalf("Run ended after %s, want soon after the 3 s failure bound", d)
	}
	t.Logf("%v", err)
}
