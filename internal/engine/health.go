package engine

import (
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
	// The static member's rejoins after a fence (rejoin.go): the fence being ridden out now
	// (empty once the new client is assigned), when the last new client was made, and whether
	// Kafka was unreachable since.
	rejoining         string
	rejoiningSince    time.Time
	rejoinedAt        time.Time
	outageSinceRejoin bool
	rejoins           int
	logged            map[kafka.ErrorCode]time.Time // last log line per error code, to rate-limit repeats
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
func (l *Loop) onKafkaError(e kafka.Error) error {
	h := &l.health
	code := e.Code()
	lvl := zapcore.WarnLevel
	msg := "Kafka client error"
	switch {
	case e.IsFatal() && code == kafka.ErrFencedInstanceID:
		// Fenced static member (KIP-345): the broker forgot this member (an outage or a pause
		// longer than session.timeout.ms) or gave its group.instance.id to another process.
		// librdkafka cannot rejoin after this error; Run builds a new client (rejoin.go).
		return &fencedMember{err: e}
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
		l.probeNow() // and every 2 s until it clears
	case code == kafka.ErrAllBrokersDown:
		h.set(func(h *health) {
			h.outageSinceRejoin = true
			if h.kafkaErr == "" {
				h.kafkaSince = time.Now()
			}
			h.kafkaErr = e.Error()
		})
		lvl, msg = zapcore.ErrorLevel, "no Kafka broker reachable; retrying"
		l.probeNow() // and every 2 s until the brokers answer
	case code == kafka.ErrUnknownTopicOrPart || code == kafka.ErrUnknownTopic:
		msg = "subscribed topic not available"
		l.probeNow()
	}
	if h.once(code) {
		l.log.Check(lvl, msg).Write(zap.String("code", code.String()), zap.Error(e))
	} else {
		l.log.Debug(msg, zap.String("code", code.String()), zap.Error(e))
	}
	return nil
}

// probeNow asks the topic probe to run at once.
func (l *Loop) probeNow() {
	select {
	case l.probeWake <- struct{}{}:
	default:
	}
}

// probeTopics runs until quit is closed: it reads the cluster's topic list (one Metadata
// request, 5 s at most) at once, every 2 s while something is wrong and every 30 s
// otherwise; it logs a subscribed topic that is missing (does not exist or is not
// authorized) at error level, by name, and one that appears at info level, and keeps
// Readiness's Kafka and topic conditions.
func (l *Loop) probeTopics(kc *kafka.Consumer, quit <-chan struct{}) {
	var literal []string
	for _, t := range l.set.Topics {
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
		case <-l.probeWake:
		}
		bad := l.probeOnce(kc, literal)
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
func (l *Loop) probeOnce(kc *kafka.Consumer, topics []string) (bad bool) {
	md, err := kc.GetMetadata(nil, true, 5000)
	h := &l.health
	if err != nil {
		h.set(func(h *health) {
			h.outageSinceRejoin = true
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
		l.log.Error("subscribed topic does not exist or is not authorized; nothing is consumed from it", zap.String("topic", name))
	}
	for _, name := range appeared {
		l.log.Info("subscribed topic available", zap.String("topic", name))
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
func (l *Loop) routeLogs(ch <-chan kafka.LogEvent, quit <-chan struct{}) {
	log := l.log.Named("librdkafka")
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

// Health is what Readiness reports of the loop's connection to Kafka and the group.
type Health struct {
	Running, Joined                 bool
	MissingTopics                   []string
	KafkaError, AuthError           string
	KafkaErrorSince, AuthErrorSince time.Time
	Fatal                           error
	// Rejoining is the fence the static member is rejoining after (rejoin.go), since
	// RejoiningSince; empty once the new client is assigned. Rejoins counts the new clients
	// made.
	Rejoining      string
	RejoiningSince time.Time
	Rejoins        int
}

// Health returns the loop's current health. Safe from any goroutine.
func (l *Loop) Health() Health {
	h := &l.health
	h.mu.Lock()
	defer h.mu.Unlock()
	return Health{Running: h.running, Joined: h.joined, MissingTopics: append([]string(nil), h.missing...),
		KafkaError: h.kafkaErr, KafkaErrorSince: h.kafkaSince, AuthError: h.authErr, AuthErrorSince: h.authSince, Fatal: h.fatal,
		Rejoining: h.rejoining, RejoiningSince: h.rejoiningSince, Rejoins: h.rejoins}
}
