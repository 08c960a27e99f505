// Package kafkatxbroker runs an in-process Kafka-compatible broker, for tests that want a
// whole kafkatx loop (a real Consumer, the relay, topic creation) without a JVM, and for the
// zero-setup demo of examples/orders. It lives apart from kafkatx and kafkatxtest so that
// importing either does not compile franz-go's fake cluster.
//
// It wraps franz-go's kfake (github.com/twmb/franz-go/pkg/kfake), which serves librdkafka (and
// so confluent-kafka-go) for what kafkatx needs: AdminClient topic creation, the idempotent
// producer, consumer groups with manual commits (CommitMessage/CommitOffsets, Committed),
// AlterConsumerGroupOffsets and ListConsumerGroupOffsets. librdkafka's own mock cluster
// (kafka.NewMockCluster) was tried first and hung on AdminClient topic creation.
//
// It is not Apache Kafka: every test that proves one of kafkatx's guarantees runs against the
// real broker started by the repository's scripts/dev-services.
//
//	b, err := kafkatxbroker.Start(&kafkatxbroker.Options{Topics: map[string]int32{"orders": 3}})
//	if err != nil { ... }
//	defer b.Close()
//	cfg := &kafkatx.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": b.Bootstrap(), "group.id": "g"}, Topics: []string{"orders"}}
package kafkatxbroker

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"
)

// Options configures Start. A nil *Options means all defaults.
type Options struct {
	// Port is the TCP port to listen on; the broker always binds 127.0.0.1 only.
	// Defaults to 0: a free port chosen by the kernel.
	Port int

	// Topics are created at start, topic name to partition count. Defaults to none: create
	// topics with the AdminClient, as against a real broker.
	Topics map[string]int32

	// DataDir, when set, keeps the broker's logs, committed offsets and groups in this
	// directory, so a broker started again on it (in a later process) finds them. Defaults to
	// "": everything lives in memory and is gone after Close.
	DataDir string

	// AutoCreateTopics lets a metadata request create a missing topic, as
	// auto.create.topics.enable does on a real broker. Defaults to false, like the
	// development broker of scripts/dev-services.
	AutoCreateTopics bool

	// GroupMinSessionTimeout is the smallest session.timeout.ms a consumer group member may
	// ask for (the broker setting group.min.session.timeout.ms). Defaults to 1 second.
	GroupMinSessionTimeout time.Duration

	// Logger receives the broker's warnings and errors, named "kafkatx.broker".
	// Defaults to zap.NewNop().
	Logger *zap.Logger
}

// Broker is a running in-process broker. Close it when done.
type Broker struct {
	cluster   *kfake.Cluster
	bootstrap string
}

// Start starts a one-node broker on 127.0.0.1 and returns once it accepts connections.
// It fails when the port is taken or DataDir cannot be used.
func Start(opts *Options) (*Broker, error) {
	if opts == nil {
		opts = &Options{}
	}
	minSession := opts.GroupMinSessionTimeout
	if minSession <= 0 {
		minSession = time.Second
	}
	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(opts.Port),
		// kfake binds "127.0.0.1:port" itself; refuse anything else in case that changes.
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				return nil, fmt.Errorf("kafkatxbroker: refusing to listen on %q (loopback only)", address)
			}
			return net.Listen(network, address)
		}),
		kfake.ClusterID("kafkatx-embedded"),
		kfake.GroupMinSessionTimeout(minSession),
		kfake.WithLogger(zapLogger{logger.Named("kafkatx.broker")}),
	}
	if opts.AutoCreateTopics {
		kopts = append(kopts, kfake.AllowAutoTopicCreation())
	}
	if opts.DataDir != "" {
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	for topic, partitions := range opts.Topics {
		if partitions <= 0 {
			return nil, fmt.Errorf("kafkatxbroker: topic %q: partitions must be positive, got %d", topic, partitions)
		}
		kopts = append(kopts, kfake.SeedTopics(partitions, topic))
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkatxbroker: start: %w", err)
	}
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		c.Close()
		return nil, errors.New("kafkatxbroker: start: no listener")
	}
	return &Broker{cluster: c, bootstrap: addrs[0]}, nil
}

// Bootstrap returns the broker's address, "127.0.0.1:port", for bootstrap.servers.
func (b *Broker) Bootstrap() string { return b.bootstrap }

// Port returns the TCP port the broker listens on.
func (b *Broker) Port() int {
	_, p, _ := net.SplitHostPort(b.bootstrap)
	n, _ := strconv.Atoi(p)
	return n
}

// Close stops the broker, closing client connections; with DataDir set it first saves its
// state there. Calling it again does nothing.
func (b *Broker) Close() { b.cluster.Close() }

// zapLogger forwards kfake's warnings and errors to zap; its info and debug lines (one per
// request) are dropped.
type zapLogger struct{ l *zap.Logger }

func (z zapLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	switch level {
	case kfake.LogLevelError:
		z.l.Error(fmt.Sprintf(format, args...))
	case kfake.LogLevelWarn:
		z.l.Warn(fmt.Sprintf(format, args...))
	}
}
