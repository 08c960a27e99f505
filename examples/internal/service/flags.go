package service

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/cmd/kafkaprops"
	"github.com/kafkatx/kafkatx/cmd/logging"
	"github.com/kafkatx/kafkatx/outbox/relays"
)

// Flags are the command-line options every consuming example takes (docs/examples.md, "Every
// consuming binary").
type Flags struct {
	Brokers, DatabaseURL, Topic, Group, Schema, InstanceID string
	// KafkaConfigFile is a librdkafka properties file applied to every Kafka client (consumer,
	// producer, admin); SessionDatabaseURL reaches PostgreSQL for what needs a session across
	// transactions (see Pools).
	KafkaConfigFile, SessionDatabaseURL string
	kafkaProps                          kafka.ConfigMap
	// MetricsAddr serves Prometheus metrics (consumer and relay) on host:port/metrics.
	MetricsAddr                        string
	Partitions, MaxAttempts, BatchSize int
	// Concurrency is kafkatx.Config.Concurrency: units of one partition in flight at once.
	Concurrency int
	// ParkKeys is kafkatx.Config.Park.Enabled: on by default in the examples (--park-keys).
	ParkKeys                     bool
	ExitWhenIdle, SessionTimeout time.Duration
	// GroupProtocol is group.protocol: "classic" or "consumer" (KIP-848); empty leaves it to
	// --kafka-config-file, else kafkatx's default (classic).
	GroupProtocol string
	// OnLogChange is kafkatx.Config.OnLogChange by name: halt (the default), adopt-earliest
	// or adopt-latest.
	OnLogChange string
}

// Register defines the flags on fs with the defaults in def (Topic, Group, BatchSize,
// MaxAttempts, Partitions, Schema); what describes the unit of work in help texts.
func (f *Flags) Register(fs *flag.FlagSet, def Flags, what string) {
	fs.StringVar(&f.Brokers, "brokers", "", "Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS)")
	fs.StringVar(&f.DatabaseURL, "database-url", "", "PostgreSQL URL, postgres://user:pass@host:port/db (default $DATABASE_URL)")
	fs.StringVar(&f.KafkaConfigFile, "kafka-config-file", "", "librdkafka properties file (key=value lines, # comments), applied to the consumer, producer and admin clients: security.protocol, sasl.*, ssl.*, ...; may hold secrets, values are never logged")
	fs.StringVar(&f.SessionDatabaseURL, "session-database-url", "", "PostgreSQL URL for what needs a database session across transactions (migrations' lock, the relay's leadership lock and LISTEN), for when --database-url goes through a transaction pooler such as PgBouncer in transaction mode (default --database-url)")
	fs.StringVar(&f.Topic, "topic", def.Topic, "topic to consume")
	fs.StringVar(&f.Group, "group", def.Group, "consumer group id")
	fs.IntVar(&f.Partitions, "partitions", def.Partitions, "partitions of topics created if missing")
	fs.StringVar(&f.Schema, "schema", def.Schema, "schema of kafkatx's tables")
	fs.DurationVar(&f.ExitWhenIdle, "exit-when-idle", 0, "exit once, for this long, no "+what+" arrived and nothing is in flight, in backoff or waiting in the outbox, and every partition's watermark has reached its log end with Kafka reachable (clock starts at the first assignment; none within 2m: exit 0, or 1 when Kafka cannot be reached)")
	fs.DurationVar(&f.SessionTimeout, "session-timeout", 0, "session.timeout.ms of the classic group protocol (default librdkafka's 45s); refused with --group-protocol consumer, where the broker's group.consumer.session.timeout.ms decides")
	fs.StringVar(&f.GroupProtocol, "group-protocol", "", "consumer group protocol: classic (the default) or consumer (KIP-848: the broker assigns partitions and owns the session timeout; a preview in the librdkafka 2.11 this build links)")
	fs.IntVar(&f.MaxAttempts, "max-attempts", def.MaxAttempts, "tries, crashes included, before a "+what+" is dead-lettered")
	fs.StringVar(&f.InstanceID, "instance-id", "", "group.instance.id for static membership (KIP-345): a restarted process with the same id gets its partitions back at once; a clean exit does not leave the group, the broker keeps the member until its session times out")
	fs.IntVar(&f.BatchSize, "batch-size", def.BatchSize, "most "+what+"s of one partition per transaction")
	fs.IntVar(&f.Concurrency, "concurrency", max(def.Concurrency, 1), "most units (transactions) of one partition in flight at once, never two of one record key: each key's "+what+"s are applied in offset order, other keys meanwhile (1: one at a time, in offset order)")
	fs.BoolVar(&f.ParkKeys, "park-keys", true, "park a key in trouble (a "+what+" to be retried: an error with attempts left, or a dependency unavailable for it) in PostgreSQL, so the partition's other keys go on; its "+what+"s run later in offset order (--park-keys=false: a "+what+" in retry holds its lane, as the library does by default)")
	fs.StringVar(&f.OnLogChange, "on-log-change", "halt", "when the log behind a watermark is another one (the topic deleted and created again, or the brokers are another cluster: its topic or cluster id differs from the recorded one): halt (exit non-zero naming both ids, nothing applied; adopt it with: kafkatx offsets reset --mode adopt), adopt-earliest (process the new log from its start) or adopt-latest (from its end), audited as log_adopted")
	fs.StringVar(&f.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics (processed, dead letters, drift and lag per partition, outbox backlog) on HOST:PORT/metrics, /healthz (200 while the process runs) and /readyz (200 once joined to the group with an assignment, possibly empty, Kafka and the database reachable, no fatal error; else 503 with a JSON reason); off when empty")
}

// FromEnv fills Brokers and DatabaseURL from KAFKA_BOOTSTRAP_SERVERS and DATABASE_URL when
// not given. Called after parsing, so --help never prints a password.
func (f *Flags) FromEnv() {
	if f.Brokers == "" {
		f.Brokers = os.Getenv("KAFKA_BOOTSTRAP_SERVERS")
	}
	if f.DatabaseURL == "" {
		f.DatabaseURL = os.Getenv("DATABASE_URL")
	}
}

// Ranges of the flags that set no kafkatx.Config field (--concurrency, --max-attempts and
// --batch-size read kafkatx's Bound table).
const (
	MaxPartitions = 10_000
	// MaxExitWhenIdle and MaxSessionTimeout bound the durations (librdkafka's
	// session.timeout.ms allows at most an hour).
	MaxExitWhenIdle   = 24 * time.Hour
	MaxSessionTimeout = time.Hour
)

// Check refuses flag values that cannot work, before anything starts, with one line naming
// the flag and its rule (the binaries exit 2): --partitions 1 to 10,000, --max-attempts,
// --batch-size and --concurrency in their kafkatx.Config Bound (1 to 1,000, 1 to 100,000,
// 1 to 1,024), --exit-when-idle 0 to 24h, --session-timeout 0 (librdkafka's default) to 1h;
// an empty or over-long --schema (PostgreSQL truncates past 63 bytes), a --topic Kafka
// refuses, an empty --group, a --metrics-addr that is not HOST:PORT, a --database-url or
// --session-database-url that does not parse (flagcheck.DatabaseURL: call FromEnv first, so
// $DATABASE_URL is checked too; the URL is never shown); a --group-protocol
// other than classic or consumer, an --on-log-change other than halt, adopt-earliest or
// adopt-latest, and --session-timeout with --group-protocol consumer
// (librdkafka refuses session.timeout.ms under KIP-848's protocol).
func (f *Flags) Check() error {
	if err := flagcheck.First(
		flagcheck.Int("partitions", f.Partitions, 1, MaxPartitions),
		kafkatx.MaxAttemptsBound.Check("--max-attempts", f.MaxAttempts),
		kafkatx.BatchSizeBound.Check("--batch-size", f.BatchSize),
		kafkatx.ConcurrencyBound.Check("--concurrency", f.Concurrency),
		flagcheck.Duration("exit-when-idle", f.ExitWhenIdle, 0, MaxExitWhenIdle),
		flagcheck.Duration("session-timeout", f.SessionTimeout, 0, MaxSessionTimeout),
		flagcheck.Schema("schema", f.Schema),
		flagcheck.Topic("topic", f.Topic),
		flagcheck.Group("group", f.Group),
		f.checkMetricsAddr(),
		flagcheck.DatabaseURL("database-url", f.DatabaseURL),
		flagcheck.DatabaseURL("session-database-url", f.SessionDatabaseURL),
	); err != nil {
		return err
	}
	// The dead letters go to <topic>.dlq (kafkatx.DeadLetterSuffixDefault), which Kafka must
	// accept too: a 246-character --topic was created, and then its dead-letter topic refused
	// (exit 1 after connecting; a second fresh-eyes attack).
	if dlq := f.Topic + kafkatx.DeadLetterSuffixDefault; flagcheck.Topic("topic", dlq) != nil {
		return fmt.Errorf("--topic is %d characters: its dead-letter topic %s%s would pass Kafka's limit of 249", len(f.Topic), "<topic>", kafkatx.DeadLetterSuffixDefault)
	}
	if _, err := kafkatx.ParseLogChangePolicy(f.OnLogChange); err != nil {
		return fmt.Errorf("--on-log-change %w", err)
	}
	switch strings.ToLower(f.GroupProtocol) {
	case "", "classic":
	case "consumer":
		if f.SessionTimeout > 0 {
			return errors.New("--session-timeout is refused with --group-protocol consumer: the broker's group.consumer.session.timeout.ms (default 45s) decides the session timeout under KIP-848")
		}
	default:
		return fmt.Errorf("--group-protocol %q: want classic or consumer", f.GroupProtocol)
	}
	return nil
}

// checkMetricsAddr refuses a --metrics-addr that is given but not HOST:PORT.
func (f *Flags) checkMetricsAddr() error {
	if f.MetricsAddr == "" {
		return nil
	}
	return flagcheck.Addr("metrics-addr", f.MetricsAddr)
}

// LoadKafkaConfigFile reads --kafka-config-file (once; later calls reuse it) and has
// librdkafka check the consumer's settings with it (kafkaprops.Check): a property it does not
// know or a value it refuses is an error here, the usage error, rather than at the first
// client; so is a producer setting the in-process relay refuses (relays.CheckKafka: acks
// other than all, enable.idempotence=false, transactional.id). Errors name the file and line
// or the property, never a value.
func (f *Flags) LoadKafkaConfigFile() error {
	if f.kafkaProps != nil || f.KafkaConfigFile == "" {
		return nil
	}
	props := kafka.ConfigMap{}
	if err := kafkaprops.Read(f.KafkaConfigFile, props); err != nil {
		return err
	}
	f.kafkaProps = props
	if err := kafkaprops.Check(f.KafkaConfig()); err != nil {
		f.kafkaProps = nil
		return fmt.Errorf("kafka config file %s: %w", f.KafkaConfigFile, err)
	}
	// The in-process relay's producer starts from the same file (ClientConfig).
	if err := relays.CheckKafka(f.ClientConfig()); err != nil {
		f.kafkaProps = nil
		return fmt.Errorf("kafka config file %s: %w", f.KafkaConfigFile, err)
	}
	return nil
}

// ClientConfig is the librdkafka configuration every client of the binary starts from:
// bootstrap.servers, then --kafka-config-file's properties (LoadKafkaConfigFile must have
// succeeded). A fresh map on every call.
func (f *Flags) ClientConfig() kafka.ConfigMap {
	cfg := kafka.ConfigMap{"bootstrap.servers": f.Brokers}
	for k, v := range f.kafkaProps {
		cfg[k] = v
	}
	return cfg
}

// KafkaConfig is the consumer's librdkafka configuration from the flags.
func (f *Flags) KafkaConfig() kafka.ConfigMap {
	cfg := f.ClientConfig()
	cfg["group.id"] = f.Group
	if f.InstanceID != "" {
		cfg["group.instance.id"] = f.InstanceID
	}
	if f.SessionTimeout > 0 {
		cfg["session.timeout.ms"] = int(f.SessionTimeout.Milliseconds())
	}
	if f.GroupProtocol != "" {
		cfg["group.protocol"] = strings.ToLower(f.GroupProtocol)
	}
	return cfg
}

// ConsumerConfig is the kafkatx.Config the flags describe: Kafka settings, topic, schema,
// max attempts and batch size, with log and reg for logs and metrics.
func (f *Flags) ConsumerConfig(log *zap.Logger, reg prometheus.Registerer) *kafkatx.Config {
	onLogChange, _ := kafkatx.ParseLogChangePolicy(f.OnLogChange) // checked by Check
	return &kafkatx.Config{
		OnLogChange: onLogChange,
		Kafka:       f.KafkaConfig(),
		Topics:      []string{f.Topic},
		Schema:      f.Schema,
		Logger:      log,
		Registerer:  reg,
		Retry:       kafkatx.RetryPolicy{MaxAttempts: f.MaxAttempts},
		Batch:       kafkatx.BatchConfig{Size: f.BatchSize},
		Concurrency: f.Concurrency,
		Park:        kafkatx.ParkConfig{Enabled: f.ParkKeys},
	}
}

// EnvLogLevel names the environment variable that sets the examples' log level: debug, info
// (the default), warn or error. Secrets are never logged at any level.
const EnvLogLevel = "KAFKATX_LOG_LEVEL"

// Logger is the examples' logger, on stderr (stdout carries only summary lines): console
// lines on a terminal, JSON otherwise (package logging; KAFKATX_LOG_FORMAT decides instead),
// at $KAFKATX_LOG_LEVEL (default info).
func Logger() *zap.Logger {
	lv := os.Getenv(EnvLogLevel)
	if lv == "" {
		lv = "info"
	}
	return logging.Must(lv)
}
