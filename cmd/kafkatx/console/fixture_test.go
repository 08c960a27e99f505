package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// fixture is a real incident on the real services: a consumer group processed 10 records of a
// topic, dead-lettering the two poison pills (offsets 3 and 7); then 5 more records arrived
// and an operator moved the group's committed offset to the log end with Kafka's admin API
// (what kafka-consumer-groups --reset-offsets does) while the service was stopped: Kafka's
// committed offset (15) is ahead of the database watermark (10).
type fixture struct {
	t        *testing.T
	pool     *pgxpool.Pool
	schema   string
	brokers  string
	topic    string
	group    string
	dbURL    string
	password string // the database URL's password, which no answer may hold
	token    string
	tokFile  string
	logs     *logSink
}

// consumerHandler fails every record whose value starts with "poison" for good, with a
// message holding the offset (so two poison pills share one fingerprint).
func consumerHandler(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	if strings.HasPrefix(string(m.Value), "poison") {
		return kafkatx.Permanent(fmt.Errorf("cannot decode order at offset %d: invalid character 'p' looking for beginning of value", m.Offset))
	}
	return nil
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dbURL := testenv.DatabaseURL(t)
	pool := testenv.Postgres(t)
	f := &fixture{t: t, pool: pool, schema: testenv.Schema(t, pool), brokers: testenv.Brokers(t), group: testenv.Group(t), dbURL: dbURL}
	if u, err := url.Parse(dbURL); err == nil && u.User != nil {
		f.password, _ = u.User.Password()
	}
	ctx := context.Background()
	if err := kafkatx.Migrate(ctx, pool, f.schema); err != nil {
		t.Fatal(err)
	}
	f.topic = testenv.Topic(t, f.brokers, 1)
	var msgs []kafka.Message
	for i := range 10 {
		v := fmt.Sprintf(`{"order": %d, "amount": %d}`, i, 10*i)
		if i == 3 || i == 7 {
			v = fmt.Sprintf("poison-%d", i)
		}
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(v),
			Headers: []kafka.Header{{Key: "trace", Value: []byte(fmt.Sprintf("t-%d", i))}}})
	}
	testenv.Produce(t, f.brokers, f.topic, msgs)
	f.runConsumer(func() bool { return f.watermark() == 10 && f.count(`SELECT count(*) FROM %s.dead_letters`) == 2 })
	var more []kafka.Message
	for i := 10; i < 15; i++ {
		more = append(more, kafka.Message{Value: []byte(fmt.Sprintf(`{"order": %d}`, i))})
	}
	testenv.Produce(t, f.brokers, f.topic, more)
	f.moveGroupOffset(15)
	f.token = "tok-" + strings.ReplaceAll(t.Name(), "/", "-") + "-0123456789abcdef"
	f.tokFile = filepath.Join(t.TempDir(), "token")
	f.writeToken(f.token)
	return f
}

// runConsumer runs a kafkatx consumer of the group until cond holds, then stops it.
func (f *fixture) runConsumer(cond func() bool) {
	f.t.Helper()
	stop := f.startConsumer()
	defer stop()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatal("the consumer did not reach the expected state within 90 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startConsumer starts a consumer of the group; the returned func stops it and waits.
func (f *fixture) startConsumer() func() {
	f.t.Helper()
	c, err := kafkatx.NewConsumer(f.pool, consumerHandler, &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": f.brokers, "group.id": f.group, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"},
		Topics: []string{f.topic},
		Schema: f.schema,
		Logger: zap.NewNop(),
		Retry:  kafkatx.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				f.t.Errorf("consumer: %v", err)
			}
		})
	}
}

// runRelay publishes the outbox until cond holds.
func (f *fixture) runRelay(cond func() bool) {
	f.t.Helper()
	r, err := relay.New(f.pool, &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": f.brokers}, Schema: f.schema,
		Logger: zap.NewNop(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatal("the relay did not publish within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// moveGroupOffset sets the group's committed offset of partition 0 with Kafka's admin API,
// as an operator does with Kafka's own tools.
func (f *fixture) moveGroupOffset(off int64) {
	f.t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": f.brokers})
	if err != nil {
		f.t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		res, err := admin.AlterConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{{Group: f.group,
			Partitions: []kafka.TopicPartition{{Topic: &f.topic, Partition: 0, Offset: kafka.Offset(off)}}}})
		if err == nil && res.ConsumerGroupsTopicPartitions[0].Partitions[0].Error == nil {
			return
		}
		if ctx.Err() != nil {
			f.t.Fatalf("move the group's offset: %v %v", err, res)
		}
		time.Sleep(500 * time.Millisecond) // the group may still be emptying after the consumer left
	}
}

func (f *fixture) count(sql string, args ...any) int64 {
	f.t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), fmt.Sprintf(sql, pgx.Identifier{f.schema}.Sanitize()), args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (f *fixture) str(sql string, args ...any) string {
	f.t.Helper()
	var s string
	if err := f.pool.QueryRow(context.Background(), fmt.Sprintf(sql, pgx.Identifier{f.schema}.Sanitize()), args...).Scan(&s); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func (f *fixture) watermark() int64 {
	return f.count(`SELECT coalesce(max(next_offset), -1) FROM %s.watermarks WHERE group_id = $1`, f.group)
}

func (f *fixture) firstDeadLetter() int64 {
	return f.count(`SELECT min(id) FROM %s.dead_letters`)
}

func (f *fixture) writeToken(tok string) {
	f.t.Helper()
	if err := os.WriteFile(f.tokFile, []byte(tok+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// logSink keeps the console's log lines.
type logSink struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *logSink) Sync() error { return nil }
func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// server starts the console over the fixture (mutate adjusts the config).
func (f *fixture) server(mutate func(*Config)) *httptest.Server {
	f.t.Helper()
	f.logs = &logSink{}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), f.logs, zap.DebugLevel))
	cfg := Config{Pool: f.pool, Schema: f.schema, Kafka: kafka.ConfigMap{"bootstrap.servers": f.brokers}, TokenFile: f.tokFile, Logger: log}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	f.t.Cleanup(func() { srv.Close(); h.Close() })
	return srv
}

// call sends one request (bearer token when tok is not empty) and returns status and body.
func call(t *testing.T, c *http.Client, method, u, tok, body string, hdr ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if c == nil {
		c = noRedirect()
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func noRedirect() *http.Client {
	return &http.Client{Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn opens a session in a client with a cookie jar and returns it with the CSRF token
// the partitions page holds.
func signIn(t *testing.T, srv *httptest.Server, tok string) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 60 * time.Second}
	resp, err := c.PostForm(srv.URL+"/signin", url.Values{"token": {tok}, "name": {"alice"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("sign-in: no CSRF token in the page after sign-in (status %d)", resp.StatusCode)
	}
	return c, m[1]
}

// newSchemaFixture is a migrated schema, a topic and a token, without the incident.
func newSchemaFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Postgres(t)
	f := &fixture{t: t, pool: pool, schema: testenv.Schema(t, pool), brokers: testenv.Brokers(t)}
	if err := kafkatx.Migrate(context.Background(), pool, f.schema); err != nil {
		t.Fatal(err)
	}
	f.topic = testenv.Topic(t, f.brokers, 1)
	f.token = "tok-" + strings.ReplaceAll(t.Name(), "/", "-") + "-0123456789abcdef"
	f.tokFile = filepath.Join(t.TempDir(), "token")
	f.writeToken(f.token)
	return f
}

// seedDeadLetters inserts n dead letters of group "scale" (topics scale.t0..scale.t9) with
// generate_series; every 10,000th error message is "needle-N" (a rare text to search for).
func seedDeadLetters(t testing.TB, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+`
		(group_id, topic, partition, "offset", key, value, error_class, error_message, stack, attempts, first_failure_at, last_failure_at)
		SELECT 'scale', 'scale.t' || (i % 10), 0, i, ('k' || i)::bytea, ('{"order":' || i || '}')::bytea,
			(ARRAY['permanent', 'max_attempts', 'panic'])[1 + i % 3],
			CASE WHEN i % 10000 = 0 THEN 'needle-' || i ELSE 'cannot decode order ' || i END, 'goroutine 1 [running]', 5,
			now() - make_interval(mins => $1 - i), now() - make_interval(mins => $1 - i)
		FROM generate_series(1, $1) AS i`, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `ANALYZE `+pgx.Identifier{schema, "dead_letters"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
}
