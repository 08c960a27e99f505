package kafkatx

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kafkatx/kafkatx/internal/kafkalog"
)

// Readiness is a snapshot of what Consumer.Ready checks: is the consumer able to do its job
// now. Ready is true when the consumer runs, has joined its group and received an
// assignment (possibly empty) since it last lost one, reaches Kafka and PostgreSQL, every
// subscribed topic exists and is authorized, and no fatal or persistent authentication error
// occurred. Reasons says why not, one sentence per condition. The JSON form is what the
// example binaries serve on /readyz.
type Readiness struct {
	Ready   bool     `json:"ready"`
	Reasons []string `json:"reasons,omitempty"`
	// Joined: an assignment (possibly empty) was received and not lost since.
	Joined bool `json:"joined"`
	// AssignedPartitions counts the partitions this member owns.
	AssignedPartitions int `json:"assigned_partitions"`
	// MissingTopics are subscribed topics the cluster's metadata does not list: they do not
	// exist, or this client may not describe them.
	MissingTopics []string `json:"missing_topics,omitempty"`
	// KafkaError is the last error that says the brokers are unreachable (all brokers down, a
	// failed metadata request), with the time it started; empty once they answer.
	KafkaError      string    `json:"kafka_error,omitempty"`
	KafkaErrorSince time.Time `json:"kafka_error_since,omitzero"`
	// AuthError is a Kafka authentication or authorization failure (SASL, TLS, topic, group or
	// cluster ACLs) with the time it started; empty once the client authenticates (or is
	// assigned partitions, for group and cluster ACLs). The library keeps retrying; a binary
	// may exit when it persists (the examples: 30 s).
	AuthError      string    `json:"auth_error,omitempty"`
	AuthErrorSince time.Time `json:"auth_error_since,omitzero"`
	// DatabaseError is set when PostgreSQL did not answer a ping within 2 s (and no
	// transaction committed in the last 5 s).
	DatabaseError string `json:"database_error,omitempty"`
	// Fatal is the error that stopped (or is stopping) Run.
	Fatal string `json:"fatal,omitempty"`
	// Waiting lists the partitions waiting for a dependency their handler reported
	// Unavailable (see UnavailableError). The consumer is still ready — it does its job, and
	// a restart would not bring the dependency back — but a probe or an operator sees who
	// waits, since when and why.
	Waiting []WaitingPartition `json:"waiting,omitempty"`
}

// WaitingPartition is a partition waiting for an unavailable dependency: the message at
// Offset has waited since Since; Cause is the handler's last Unavailable error (sanitized,
// at most 512 bytes).
type WaitingPartition struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Since     time.Time `json:"since"`
	Cause     string    `json:"cause"`
}

// NotReadyError is Ready's error: the Readiness that was not ready.
type NotReadyError struct{ Readiness Readiness }

func (e *NotReadyError) Error() string {
	return "kafkatx: consumer not ready: " + strings.Join(e.Readiness.Reasons, "; ")
}

// Ready reports nil when the consumer can do its job now (Readiness.Ready), else a
// *NotReadyError naming every reason. It pings PostgreSQL (2 s at most) unless a transaction
// committed in the last 5 s. Safe to call from any goroutine, for a readiness probe.
func (c *Consumer) Ready(ctx context.Context) error {
	r := c.Readiness(ctx)
	if r.Ready {
		return nil
	}
	return &NotReadyError{Readiness: r}
}

// Readiness returns the snapshot Ready decides on. Safe to call from any goroutine.
func (c *Consumer) Readiness(ctx context.Context) Readiness {
	h := &c.health
	h.mu.Lock()
	r := Readiness{Joined: h.joined, MissingTopics: append([]string(nil), h.missing...),
		KafkaError: h.kafkaErr, KafkaErrorSince: h.kafkaSince, AuthError: h.authErr, AuthErrorSince: h.authSince}
	running := h.running
	if h.fatal != nil {
		r.Fatal = h.fatal.Error()
	}
	h.mu.Unlock()
	c.mu.Lock()
	r.AssignedPartitions = len(c.parts)
	for _, p := range c.parts {
		if w := p.waiting.Load(); w != nil {
			r.Waiting = append(r.Waiting, *w)
		}
	}
	c.mu.Unlock()
	sort.Slice(r.Waiting, func(i, j int) bool {
		a, b := r.Waiting[i], r.Waiting[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
	})
	if r.Fatal != "" {
		r.Reasons = append(r.Reasons, "fatal error: "+r.Fatal)
	}
	if !running {
		r.Reasons = append(r.Reasons, "the consumer is not running")
	}
	if running && !r.Joined {
		r.Reasons = append(r.Reasons, "not a member of the consumer group yet (no assignment received)")
	}
	if r.KafkaError != "" {
		r.Reasons = append(r.Reasons, fmt.Sprintf("Kafka unreachable since %s: %s", r.KafkaErrorSince.UTC().Format(time.RFC3339), r.KafkaError))
	}
	if r.AuthError != "" {
		r.Reasons = append(r.Reasons, fmt.Sprintf("Kafka authentication or authorization failing since %s: %s", r.AuthErrorSince.UTC().Format(time.RFC3339), r.AuthError))
	}
	if len(r.MissingTopics) > 0 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("subscribed topics that do not exist or are not authorized: %s", strings.Join(r.MissingTopics, ", ")))
	}
	if time.Since(unixNanoTime(c.stats.lastCommit.Load())) > 5*time.Second {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.pool.Ping(pctx)
		cancel()
		if err != nil {
			r.DatabaseError = err.Error()
			r.Reasons = append(r.Reasons, "database unreachable: "+err.Error())
		}
	}
	r.Ready = len(r.Reasons) == 0
	return r
}

// health is the state Readiness reads, written by the poll loop, the rebalance callback and
// the topic probe.
type health struct {
	mu         sync.Mutex
	running    bool
	joined     bool
	kafkaErr   string
	kafkaSince time.Time
	authErr    string
	authCode   kafka.ErrorCode
	authSince  time.Time
	missing    []string
	fatal      error
	logged     map[kafka.ErrorCode]time.Time // last log line per error code, to rate-limit repeats
}

// authentication failures clear once a metadata request succeeds; authorization failures of
// the group or cluster once an assignment arrives.
var (
	authenticationCodes = []kafka.ErrorCode{kafka.ErrAuthentication, kafka.ErrSaslAuthenticationFailed, kafka.ErrSsl,
		kafka.ErrTopicAuthorizationFailed}
	authorizationCodes = []kafka.ErrorCode{kafka.ErrGroupAuthorizationFailed, kafka.ErrClusterAuthorizationFailed,
		kafka.ErrTransactionalIDAuthorizationFailed}
)

func hasCode(codes []kafka.ErrorCode, c kafka.ErrorCode) bool {
	for _, x := range codes {
		if x == c {
			return true
		}
	}
	return false
}

// once reports whether an error with code may be logged at its level now: at most one line
// per code every 10 s (librdkafka repeats an error on every reconnect).
func (h *health) once(code kafka.ErrorCode) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.logged == nil {
		h.logged = map[kafka.ErrorCode]time.Time{}
	}
	if t, ok := h.logged[code]; ok && time.Since(t) < 10*time.Second {
		return false
	}
	h.logged[code] = time.Now()
	return true
}

func (h *health) set(f func(h *health)) {
	h.mu.Lock()
	f(h)
	h.mu.Unlock()
}

// onKafkaError classifies a librdkafka error event polled by Run: a fatal error stops Run;
// authentication, connectivity and topic errors are logged (repeats rate-limited) and shown in
// Readiness. It returns the fatal error, if e is one.
func (c *Consumer) onKafkaError(e kafka.Error) error {
	h := &c.health
	code := e.Code()
	lvl := zapcore.WarnLevel
	msg := "Kafka client error"
	switch {
	case e.IsFatal():
		err := fmt.Errorf("kafkatx: fatal Kafka error: %w", e)
		h.set(func(h *health) { h.fatal = err })
		return err // Run returns it (and logs "consumer stopping" with it as the cause)
	case hasCode(authenticationCodes, code) || hasCode(authorizationCodes, code):
		h.set(func(h *health) {
			if h.authErr == "" {
				h.authSince = time.Now()
			}
			h.authErr, h.authCode = e.Error(), code
		})
		lvl, msg = zapcore.ErrorLevel, "Kafka authentication or authorization failed; retrying"
		c.probeNow() // and every 2 s until it clears
	case code == kafka.ErrAllBrokersDown:
		h.set(func(h *health) {
			if h.kafkaErr == "" {
				h.kafkaSince = time.Now()
			}
			h.kafkaErr = e.Error()
		})
		lvl, msg = zapcore.ErrorLevel, "no Kafka broker reachable; retrying"
		c.probeNow() // and every 2 s until the brokers answer
	case code == kafka.ErrUnknownTopicOrPart || code == kafka.ErrUnknownTopic:
		msg = "subscribed topic not available"
		c.probeNow()
	}
	if h.once(code) {
		c.log.Check(lvl, msg).Write(zap.String("code", code.String()), zap.Error(e))
	} else {
		c.log.Debug(msg, zap.String("code", code.String()), zap.Error(e))
	}
	return nil
}

// probeNow asks the topic probe to run at once.
func (c *Consumer) probeNow() {
	select {
	case c.probeWake <- struct{}{}:
	default:
	}
}

// probeTopics runs until quit is closed: it reads the cluster's topic list (one Metadata
// request, 5 s at most) at once, every 2 s while something is wrong and every 30 s
// otherwise; it logs a subscribed topic that is missing (does not exist or is not
// authorized) at error level, by name, and one that appears at info level, and keeps
// Readiness's Kafka and topic conditions.
func (c *Consumer) probeTopics(quit <-chan struct{}) {
	var literal []string
	for _, t := range c.cfg.Topics {
		if !strings.HasPrefix(t, "^") { // a regular expression subscription names no topic
			literal = append(literal, t)
		}
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		case <-c.probeWake:
		}
		bad := c.probeOnce(literal)
		next := 30 * time.Second
		if bad {
			next = 2 * time.Second
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// probeOnce runs one probe and reports whether something is wrong.
func (c *Consumer) probeOnce(topics []string) (bad bool) {
	md, err := c.kc.GetMetadata(nil, true, 5000)
	h := &c.health
	if err != nil {
		h.set(func(h *health) {
			if h.kafkaErr == "" {
				h.kafkaSince = time.Now()
			}
			h.kafkaErr = "metadata request: " + err.Error()
		})
		return true
	}
	var missing []string
	for _, name := range topics {
		if tm, ok := md.Topics[name]; !ok || tm.Error.Code() != kafka.ErrNoError {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	var appeared, gone []string
	h.set(func(h *health) {
		h.kafkaErr, h.kafkaSince = "", time.Time{}
		gone = subtract(missing, h.missing)
		appeared = subtract(h.missing, missing)
		h.missing = missing
		if h.authErr != "" && hasCode(authenticationCodes, h.authCode) && len(missing) == 0 {
			h.authErr, h.authSince = "", time.Time{}
		}
		bad = len(missing) > 0 || h.authErr != "" || !h.joined
	})
	for _, name := range gone {
		c.log.Error("subscribed topic does not exist or is not authorized; nothing is consumed from it", zap.String("topic", name))
	}
	for _, name := range appeared {
		c.log.Info("subscribed topic available", zap.String("topic", name))
	}
	return bad
}

// subtract returns the elements of a not in b.
func subtract(a, b []string) []string {
	var out []string
	for _, x := range a {
		found := false
		for _, y := range b {
			found = found || x == y
		}
		if !found {
			out = append(out, x)
		}
	}
	return out
}

// routeLogs writes librdkafka's log events (go.logs.channel) to the consumer's logger, named
// "kafkatx.consumer.librdkafka", with their facility and syslog level, until quit is closed;
// then it writes what is still buffered and returns.
func (c *Consumer) routeLogs(ch <-chan kafka.LogEvent, quit <-chan struct{}) {
	log := c.log.Named("librdkafka")
	write := func(e kafka.LogEvent) {
		log.Check(kafkalog.EventLevel(e), e.Message).Write(zap.String("facility", e.Tag), zap.Int("syslog_level", e.Level), zap.String("client", e.Name))
	}
	for {
		select {
		case e := <-ch:
			write(e)
		case <-quit:
			for {
				select {
				case e := <-ch:
					write(e)
				default:
					return
				}
			}
		}
	}
}

// tpOffsets formats partitions as "topic[partition]@offset" for the assignment logs.
func tpOffsets(tps []kafka.TopicPartition) []string {
	out := make([]string, len(tps))
	for i, tp := range tps {
		if tp.Offset >= 0 {
			out[i] = fmt.Sprintf("%s[%d]@%d", *tp.Topic, tp.Partition, tp.Offset)
		} else {
			out[i] = fmt.Sprintf("%s[%d]", *tp.Topic, tp.Partition)
		}
	}
	return out
}

// closeWithin closes kc, waiting at most d: confluent-kafka-go's Close polls until librdkafka
// reports the consumer closed, which after some fatal errors (a fenced static member) never
// happens. Past d the close goes on in the background and the error says so.
func closeWithin(kc *kafka.Consumer, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- kc.Close() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("the Kafka client did not close within %s (Config.CloseTimeout); left to the process exit", d)
	}
}
