// Package testenv gives the test suite its PostgreSQL and Apache Kafka: a pool, a fresh schema
// or database per test, a fresh topic per test, and Kafka's own consumer-group command.
//
// The services come from the environment, normally set by
//
//	scripts/dev-services up && eval "$(scripts/dev-services env)"
//
// which `make test` does. The variables:
//
//   - DATABASE_URL: a libpq-style PostgreSQL URL (or keyword/value string) whose role may create
//     databases, e.g. postgres://kafkatx:kafkatx@127.0.0.1:5432/kafkatx?sslmode=disable.
//   - KAFKA_BOOTSTRAP_SERVERS: bootstrap.servers of a real Apache Kafka broker with topic
//     auto-creation off, e.g. 127.0.0.1:9092.
//   - KAFKATX_KAFKA_TOOLS: path of a kafka-consumer-groups command (Kafka's
//     ConsumerGroupCommand); defaults to the repository's scripts/kafka-consumer-groups.
//   - CI: when set (to anything but "", "0" or "false"), a missing or unreachable service fails
//     the test. Otherwise the test is skipped with a loud reason, so `go test ./...` without
//     services still runs the unit tests.
//
// Tests may run in parallel against one server: every name handed out (schema, database,
// topic, group) is unique, and each is removed when the test ends.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
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

	"github.com/kafkatx/kafkatx/pg"
)

// Environment variables read by this package.
const (
	EnvDatabaseURL     = "DATABASE_URL"
	EnvBootstrap       = "KAFKA_BOOTSTRAP_SERVERS"
	EnvKafkaTools      = "KAFKATX_KAFKA_TOOLS"
	EnvCI              = "CI"
	setupHint          = `start them with: scripts/dev-services up && eval "$(scripts/dev-services env)" (or run make test)`
	defaultOpTimeout   = 60 * time.Second
	maxIdentifierBytes = 63 // PostgreSQL's NAMEDATALEN-1
)

// InCI reports whether the CI environment variable is set, in which case a missing service is a
// test failure rather than a skip.
func InCI() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvCI)))
	return v != "" && v != "0" && v != "false"
}

// Unavailable stops the test because a service it needs is missing: t.Fatal in CI, t.Skip
// (with a loud reason) elsewhere.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("SERVICE UNAVAILABLE in CI: %s", reason)
	}
	t.Skipf("SKIPPED, SERVICE UNAVAILABLE: %s; %s", reason, setupHint)
}

// DatabaseURL returns DATABASE_URL, or stops the test (see Unavailable) when it is unset.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvDatabaseURL)
	if u == "" {
		Unavailable(t, "%s is not set", EnvDatabaseURL)
	}
	return u
}

// Postgres returns a pool connected to DATABASE_URL, closed when the test ends. It stops the
// test (see Unavailable) when DATABASE_URL is unset or the server does not answer within 10 s.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return connect(t, DatabaseURL(t))
}

func connect(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	return connectWith(t, dsn, nil)
}

// connectWith is connect with edit (when not nil) applied to the parsed configuration.
func connectWith(t testing.TB, dsn string, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pg.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvDatabaseURL, err)
	}
	if edit != nil {
		edit(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		Unavailable(t, "PostgreSQL at %s@%s:%d does not answer: %v", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates a fresh, uniquely named schema and returns its name (unquoted; quote it with
// pgx.Identifier). It is dropped with CASCADE when the test ends.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := UniqueName(t, "t_", maxIdentifierBytes)
	ctx, cancel := context.WithTimeout(context.Background(), defaultOpTimeout)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultOpTimeout)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("testenv: drop schema %s: %v", name, err)
		}
	})
	return name
}

// Database creates a fresh, uniquely named database on DATABASE_URL's server and returns a URL
// (or keyword/value string, following DATABASE_URL's form) that connects to it. It is dropped
// WITH (FORCE) when the test ends, closing any connection left open. The role must have CREATEDB.
func Database(t testing.TB) string {
	t.Helper()
	base := DatabaseURL(t)
	pool := connect(t, base)
	name := UniqueName(t, "t_", maxIdentifierBytes)
	ctx, cancel := context.WithTimeout(context.Background(), defaultOpTimeout)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	// Registered after connect's pool.Close, so it runs before it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultOpTimeout)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(base, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dsn
}

// withDatabase returns dsn (a postgres:// URL or a keyword/value string) pointing at database db.
func withDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", EnvDatabaseURL, err)
		}
		u.Path = "/" + db
		u.RawPath = ""
		q := u.Query()
		if q.Has("dbname") {
			q.Set("dbname", db)
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// keyword/value: a later keyword overrides an earlier one.
	return dsn + " dbname=" + db, nil
}

var (
	reachMu sync.Mutex
	reached = map[string]error{}
)

// Brokers returns KAFKA_BOOTSTRAP_SERVERS after checking that its first address accepts TCP
// connections; it stops the test (see Unavailable) otherwise.
func Brokers(t testing.TB) string {
	t.Helper()
	brokers := os.Getenv(EnvBootstrap)
	if brokers == "" {
		Unavailable(t, "%s is not set", EnvBootstrap)
	}
	first := strings.TrimSpace(strings.Split(brokers, ",")[0])
	if i := strings.Index(first, "://"); i >= 0 { // PLAINTEXT://host:port
		first = first[i+3:]
	}
	reachMu.Lock()
	err, ok := reached[first]
	if !ok || err != nil {
		var c net.Conn
		c, err = net.DialTimeout("tcp", first, 5*time.Second)
		if err == nil {
			c.Close()
		}
		reached[first] = err
	}
	reachMu.Unlock()
	if err != nil {
		Unavailable(t, "Kafka at %s=%s does not accept connections: %v", EnvBootstrap, brokers, err)
	}
	return brokers
}

// Topic creates a uniquely named topic with the given number of partitions (replication factor
// 1) through the AdminClient, waits until every partition has a leader that answers ListOffsets,
// and returns its name.
// The topic is deleted when the test ends.
func Topic(t testing.TB, brokers string, partitions int) string {
	t.Helper()
	return TopicWithConfig(t, brokers, partitions, nil)
}

// TopicWithConfig is Topic with topic-level configs, e.g. {"message.timestamp.type":
// "LogAppendTime"} or {"max.message.bytes": "2097152"}.
func TopicWithConfig(t testing.TB, brokers string, partitions int, config map[string]string) string {
	t.Helper()
	return NamedTopic(t, brokers, UniqueName(t, "kafkatx-test-", 200), partitions, config)
}

// NamedTopic is TopicWithConfig for a topic whose name the test chooses (one an ACL names,
// for example): created (an existing one is taken as it is) with its partitions led and
// answering, deleted when the test ends.
func NamedTopic(t testing.TB, brokers, name string, partitions int, config map[string]string) string {
	t.Helper()
	if partitions <= 0 {
		t.Fatalf("testenv: topic partitions must be positive, got %d", partitions)
	}
	admin := newAdmin(t, brokers)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultOpTimeout)
	defer cancel()
	res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{{
		Topic: name, NumPartitions: partitions, ReplicationFactor: 1, Config: config,
	}}, kafka.SetAdminOperationTimeout(30*time.Second))
	if err == nil && len(res) == 1 && res[0].Error.Code() != kafka.ErrNoError && res[0].Error.Code() != kafka.ErrTopicAlreadyExists {
		err = res[0].Error
	}
	if err != nil {
		t.Fatalf("testenv: create topic %s (%d partitions) at %s: %v", name, partitions, brokers, err)
	}
	t.Cleanup(func() { deleteTopic(t, brokers, name) })
	if err := waitForLeaders(ctx, admin, name, partitions); err != nil {
		t.Fatalf("testenv: topic %s: %v", name, err)
	}
	if err := waitForListOffsets(ctx, admin, name, partitions); err != nil {
		t.Fatalf("testenv: topic %s: %v", name, err)
	}
	return name
}

// waitForListOffsets polls ListOffsets until every partition's leader answers it. A broker
// publishes a new topic in its metadata a moment before its replica manager leads the
// partitions, and answers NOT_LEADER_OR_FOLLOWER in between.
func waitForListOffsets(ctx context.Context, admin *kafka.AdminClient, topic string, partitions int) error {
	specs := make(map[kafka.TopicPartition]kafka.OffsetSpec, partitions)
	for p := range partitions {
		specs[kafka.TopicPartition{Topic: &topic, Partition: int32(p)}] = kafka.LatestOffsetSpec
	}
	var last string
	for {
		res, err := admin.ListOffsets(ctx, specs)
		if err == nil {
			last = ""
			for tp, info := range res.ResultInfos {
				if info.Error.Code() != kafka.ErrNoError {
					last = fmt.Sprintf("partition %d: %v", tp.Partition, info.Error)
				}
			}
			if last == "" && len(res.ResultInfos) == partitions {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("partitions do not answer ListOffsets: %s", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func newAdmin(t testing.TB, brokers string) *kafka.AdminClient {
	t.Helper()
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatalf("testenv: admin client for %s: %v", brokers, err)
	}
	return admin
}

// waitForLeaders polls metadata until the topic shows all its partitions with a leader.
func waitForLeaders(ctx context.Context, admin *kafka.AdminClient, topic string, partitions int) error {
	var last string
	for {
		md, err := admin.GetMetadata(&topic, false, 5000)
		if err == nil {
			tm, ok := md.Topics[topic]
			switch {
			case !ok:
				last = "not in metadata"
			case tm.Error.Code() != kafka.ErrNoError:
				last = tm.Error.Error()
			case len(tm.Partitions) != partitions:
				last = fmt.Sprintf("%d of %d partitions in metadata", len(tm.Partitions), partitions)
			default:
				ready := true
				for _, p := range tm.Partitions {
					if p.Leader < 0 || p.Error.Code() != kafka.ErrNoError {
						ready = false
						last = fmt.Sprintf("partition %d has no leader yet", p.ID)
					}
				}
				if ready {
					return nil
				}
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DeleteTopic deletes the topic name now (a test that deletes a topic under a running
// client); a failure is logged, as at cleanup.
func DeleteTopic(t testing.TB, brokers, name string) {
	t.Helper()
	deleteTopic(t, brokers, name)
}

func deleteTopic(t testing.TB, brokers, name string) {
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Logf("testenv: delete topic %s: %v", name, err)
		return
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.DeleteTopics(ctx, []string{name}, kafka.SetAdminOperationTimeout(20*time.Second))
	if err == nil && len(res) == 1 && res[0].Error.Code() != kafka.ErrNoError && res[0].Error.Code() != kafka.ErrUnknownTopicOrPart {
		err = res[0].Error
	}
	if err != nil {
		t.Logf("testenv: delete topic %s: %v", name, err)
	}
}

// Group returns a unique consumer group id for the test.
func Group(t testing.TB) string {
	t.Helper()
	return UniqueName(t, "kafkatx-test-g-", 200)
}

// ConsumerGroupsTool returns the path of Kafka's kafka-consumer-groups command
// (org.apache.kafka.tools.consumer.group.ConsumerGroupCommand): KAFKATX_KAFKA_TOOLS, or the
// repository's scripts/kafka-consumer-groups. Run it as an operator would, e.g.
//
//	exec.Command(tool, "--bootstrap-server", brokers, "--group", g, "--reset-offsets",
//		"--topic", topic+":0", "--to-offset", "5", "--execute")
//
// Note that it reports most errors ("Error: ...") on stdout with exit status 0.
// It stops the test (see Unavailable) when the command cannot be found.
func ConsumerGroupsTool(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvKafkaTools); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			Unavailable(t, "%s=%s is not an executable file", EnvKafkaTools, p)
		}
		return p
	}
	root, err := RepoRoot()
	if err != nil {
		Unavailable(t, "%s is not set and the repository root was not found: %v", EnvKafkaTools, err)
	}
	p := filepath.Join(root, "scripts", "kafka-consumer-groups")
	if _, err := os.Stat(p); err != nil {
		Unavailable(t, "%s is not set and %s is missing", EnvKafkaTools, p)
	}
	return p
}

// RepoRoot walks up from the working directory (a package directory under go test) to the
// repository's root: the directory whose go.mod is the library's (module
// github.com/kafkatx/kafkatx), past the go.mod of a nested module (cmd, examples).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modfileDeclares(b, "github.com/kafkatx/kafkatx") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns prefix + a lower-case slug of the test's name + a random suffix, at most
// max bytes, using only [a-z0-9_-] from the test name, so it is a valid PostgreSQL identifier,
// topic name and group id. Names from earlier runs against the same server never collide.
func UniqueName(t testing.TB, prefix string, max int) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random name: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	sep := "_"
	if strings.Contains(prefix, "-") {
		sep = "-"
	}
	slug := strings.Trim(unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), sep), sep)
	room := max - len(prefix) - len(sep) - len(suffix)
	if room < 0 {
		room = 0
	}
	if len(slug) > room {
		slug = slug[:room]
	}
	slug = strings.Trim(slug, sep)
	if slug == "" {
		return prefix + suffix
	}
	return prefix + slug + sep + suffix
}

// SecondBrokers returns KAFKA2_BOOTSTRAP_SERVERS, a second Kafka cluster of its own (another
// cluster id: `scripts/dev-services up kafka2`), after checking that it accepts TCP
// connections; it stops the test (see Unavailable) otherwise.
func SecondBrokers(t testing.TB) string {
	t.Helper()
	FullTier(t, "needs a second Kafka cluster (scripts/dev-services up kafka2)")
	brokers := os.Getenv("KAFKA2_BOOTSTRAP_SERVERS")
	if brokers == "" {
		Unavailable(t, "KAFKA2_BOOTSTRAP_SERVERS is not set (scripts/dev-services up kafka2)")
	}
	c, err := net.DialTimeout("tcp", strings.TrimSpace(strings.Split(brokers, ",")[0]), 5*time.Second)
	if err != nil {
		Unavailable(t, "the second Kafka cluster at KAFKA2_BOOTSTRAP_SERVERS=%s does not accept connections: %v", brokers, err)
	}
	c.Close()
	return brokers
}

// RecreateTopic deletes topic and creates it again under the same name with partitions
// partitions (a new topic id, KIP-516; the group's committed offsets on it are gone), retrying
// while the broker still finishes the deletion, and waits until its partitions answer.
func RecreateTopic(t testing.TB, brokers, topic string, partitions int) {
	t.Helper()
	admin := newAdmin(t, brokers)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := admin.DeleteTopics(ctx, []string{topic}, kafka.SetAdminOperationTimeout(30*time.Second))
	if err == nil && len(res) == 1 && res[0].Error.Code() != kafka.ErrNoError {
		err = res[0].Error
	}
	if err != nil {
		t.Fatalf("testenv: delete topic %s: %v", topic, err)
	}
	for {
		res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
			kafka.SetAdminOperationTimeout(30*time.Second))
		if err == nil && len(res) == 1 && res[0].Error.Code() == kafka.ErrNoError {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: create topic %s again: %v %v", topic, err, res)
		}
		time.Sleep(200 * time.Millisecond) // TOPIC_ALREADY_EXISTS while the deletion completes
	}
	if err := waitForLeaders(ctx, admin, topic, partitions); err != nil {
		t.Fatalf("testenv: topic %s: %v", topic, err)
	}
	if err := waitForListOffsets(ctx, admin, topic, partitions); err != nil {
		t.Fatalf("testenv: topic %s: %v", topic, err)
	}
}

// AddPartitions raises topic's partition count to total (Kafka CreatePartitions) and waits
// until every partition answers.
func AddPartitions(t testing.TB, brokers, topic string, total int) {
	t.Helper()
	admin := newAdmin(t, brokers)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := admin.CreatePartitions(ctx, []kafka.PartitionsSpecification{{Topic: topic, IncreaseTo: total}}, kafka.SetAdminOperationTimeout(30*time.Second))
	if err == nil && len(res) == 1 && res[0].Error.Code() != kafka.ErrNoError {
		err = res[0].Error
	}
	if err != nil {
		t.Fatalf("testenv: raise the partitions of %s to %d: %v", topic, total, err)
	}
	if err := waitForLeaders(ctx, admin, topic, total); err != nil {
		t.Fatalf("testenv: topic %s: %v", topic, err)
	}
	if err := waitForListOffsets(ctx, admin, topic, total); err != nil {
		t.Fatalf("testenv: topic %s: %v", topic, err)
	}
}

// WaitFor polls cond every 50 ms until it holds, and fails the test when timeout passes
// first, naming what was awaited and, when given, detail() evaluated at the deadline.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			for _, d := range detail {
				msg += "; " + d()
			}
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// modfileDeclares reports whether the go.mod text b declares module path.
func modfileDeclares(b []byte, path string) bool {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == path
		}
	}
	return false
}
