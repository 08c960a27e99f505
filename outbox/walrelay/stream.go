package walrelay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
	"github.com/kafkatx/kafkatx/pg"
)

// stream is one replication session: decoded transactions in, Kafka transactions out.
type stream struct {
	r      *Relay
	conn   *pgconn.PgConn
	k      *kafkaSide
	prefix string
	slot   string
	src    uint32    // sourceHash of the cluster, database and schema
	sysID  string    // the cluster's system identifier
	tl     timelines // the server's timeline history at the stream's start

	ckpt      pglogrepl.LSN // commit LSN published through on the current timeline (the checkpoint's coverage)
	confirmed pglogrepl.LSN // position to report as flushed
	sent      pglogrepl.LSN // position last reported

	// the decoded transaction in progress
	inTx     bool
	txCommit pglogrepl.LSN
	txSrc    uint32 // the outbox id's source bits: src and the commit's timeline
	txPos    uint32
	txSkip   bool
	txOurs   int

	done <-chan struct{} // run's ctx.Done(): the relay is stopping (stopping)

	// the open Kafka transaction
	kOpen       bool
	kRecords    int
	kFirst      time.Time
	kLastCommit pglogrepl.LSN
	kLastEnd    pglogrepl.LSN

	headers       []kafka.Header
	msg           kafka.Message
	topic         string
	idBuf, posBuf []byte
}

// appendUUID appends u's 36-character text form.
func appendUUID(b []byte, u [16]byte) []byte {
	const hexd = "0123456789abcdef"
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hexd[c>>4], hexd[c&0x0f])
	}
	return b
}

// appendPosition appends HeaderPosition's value: "<commit LSN>#<position>".
// The LSN is in PostgreSQL's text form (upper-case hex), as pglogrepl.LSN.String.
func appendPosition(b []byte, at position) []byte {
	b = appendUpperHex(b, uint64(at.commit)>>32)
	b = append(b, '/')
	b = appendUpperHex(b, uint64(at.commit)&0xffffffff)
	b = append(b, '#')
	return strconv.AppendUint(b, uint64(at.pos), 10)
}

func appendUpperHex(b []byte, v uint64) []byte {
	start := len(b)
	b = strconv.AppendUint(b, v, 16)
	for i := start; i < len(b); i++ {
		if b[i] >= 'a' {
			b[i] -= 'a' - 'A'
		}
	}
	return b
}

// errRestart ends a stream whose Kafka transaction was aborted for a refused record: the next
// stream re-reads from the slot's confirmed position and parks the record.
var errRestart = errors.New("walrelay: a record was refused; publishing the transaction again without it")

// errBatchSize ends a stream that met a topic whose max.message.bytes is below the producer's
// batch.size: the next stream's producer batches under it.
var errBatchSize = errors.New("walrelay: lowering the producer's batch.size to a topic's max.message.bytes")

func (s *stream) run(ctx context.Context) error {
	s.done = ctx.Done()
	nextStatus := time.Now().Add(s.r.cfg.StatusInterval)
	for {
		if s.r.wantReply.Swap(false) {
			if err := s.sendStatus(true); err != nil {
				return err
			}
		}
		deadline := nextStatus
		if s.kOpen && !s.inTx {
			d := s.kFirst.Add(s.r.cfg.Linger)
			if now := time.Now(); now.After(d) {
				d = now.Add(time.Millisecond) // past Linger: commit at the stream's first pause
			}
			if d.Before(deadline) {
				deadline = d
			}
		}
		if w := time.Now().Add(50 * time.Millisecond); w.Before(deadline) {
			deadline = w // Pending's requests are served within 50 ms
		}
		// A read deadline on the socket rather than a context per message: pgconn watches a
		// context with a goroutine per call. A timeout leaves the connection usable.
		if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
			return s.abortOpen(fmt.Errorf("walrelay: set read deadline: %w", err))
		}
		t0 := time.Now()
		msg, err := s.conn.ReceiveMessage(context.Background())
		t1 := time.Now()
		s.r.steps.receive.Add(int64(t1.Sub(t0)))
		if err != nil {
			if ctx.Err() != nil {
				return s.abortOpen(ctx.Err())
			}
			if !pgconn.Timeout(err) {
				return s.abortOpen(fmt.Errorf("walrelay: receive: %w", err))
			}
			if s.kOpen && !s.inTx && time.Since(s.kFirst) >= s.r.cfg.Linger {
				if err := s.commit(ctx); err != nil {
					return err
				}
			}
		} else {
			switch m := msg.(type) {
			case *pgproto3.CopyData:
				if err := s.copyData(ctx, m.Data); err != nil {
					return s.abortOpen(err)
				}
				s.r.steps.handle.Add(int64(time.Since(t1)))
			case *pgproto3.ErrorResponse:
				return s.abortOpen(fmt.Errorf("walrelay: stream: %w", pgconn.ErrorResponseToPgError(m)))
			case *pgproto3.CopyDone:
				return s.abortOpen(errors.New("walrelay: the server ended the stream"))
			}
		}
		if s.kOpen && !s.inTx && (s.kRecords >= s.r.cfg.MaxBatchRecords || time.Since(s.kFirst) >= s.r.cfg.MaxLinger) {
			if err := s.commit(ctx); err != nil {
				return err
			}
		}
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(false); err != nil {
				return err
			}
			nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
		}
	}
}

func (s *stream) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: keepalive: %w", err)
		}
		if !s.inTx && !s.kOpen {
			// Nothing decoded is unpublished: every transaction committed before the
			// walsender's position was sent, so the slot may move past other WAL.
			s.advance(ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			return s.sendStatus(false)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: XLogData: %w", err)
		}
		return s.logical(ctx, x.WALData)
	}
	return nil
}

// logical handles one pgoutput message (proto 1): Begin, Message, Commit; others (relations,
// rows of a publication someone filled) are ignored.
func (s *stream) logical(ctx context.Context, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	switch b[0] {
	case 'B':
		if len(b) < 21 {
			return errors.New("walrelay: short Begin message")
		}
		s.inTx, s.txCommit, s.txPos, s.txOurs = true, pglogrepl.LSN(binary.BigEndian.Uint64(b[1:9])), 0, 0
		s.txSrc = timelineSource(s.src, s.tl.of(s.txCommit))
		s.txSkip = s.txCommit <= s.ckpt
	case 'M':
		// flags(1) lsn(8) prefix(cstring) length(4) content
		if len(b) < 15 || b[1]&1 == 0 || !s.inTx {
			return nil // non-transactional: never ours
		}
		rest := b[10:]
		z := bytes.IndexByte(rest, 0)
		if z < 0 || len(rest) < z+5 {
			return errors.New("walrelay: malformed Message")
		}
		if string(rest[:z]) != s.prefix {
			return nil
		}
		n := binary.BigEndian.Uint32(rest[z+1:])
		content := rest[z+5:]
		if uint64(n) > uint64(len(content)) {
			return errors.New("walrelay: truncated Message")
		}
		content = content[:n]
		if s.txSkip {
			// Covered by the checkpoint; the position still counts the records.
			if len(content) >= 5 && content[0] == 2 {
				s.txPos += binary.BigEndian.Uint32(content[1:])
			} else {
				s.txPos++
			}
			return nil
		}
		first := s.txPos
		err := outbox.RangeWAL(content, func(i int, rec outbox.Record) error {
			s.txPos = first + uint32(i) + 1
			return s.record(ctx, position{s.txCommit, first + uint32(i)}, rec)
		})
		if errors.Is(err, outbox.ErrMalformedWAL) {
			// A malformed message: park what is left of it as one undecodable record.
			at := position{s.txCommit, s.txPos}
			s.txPos++
			return s.park(ctx, at, outbox.Record{Topic: "(undecodable)", Value: append([]byte(nil), content...)}, err.Error())
		}
		return err
	case 'C':
		if len(b) < 26 {
			return errors.New("walrelay: short Commit message")
		}
		end := pglogrepl.LSN(binary.BigEndian.Uint64(b[10:18]))
		s.inTx = false
		switch {
		case s.txOurs > 0:
			s.kLastCommit, s.kLastEnd = s.txCommit, end
		case s.kOpen:
			s.kLastEnd = end
		default:
			s.advance(end)
		}
	}
	return nil
}

// record produces one outbox record into the open Kafka transaction (opening it), or parks it
// when it cannot be published.
func (s *stream) record(ctx context.Context, at position, rec outbox.Record) error {
	s.r.mu.Lock()
	reason, refuse := s.r.refuse[at]
	s.r.mu.Unlock()
	if refuse {
		return s.park(ctx, at, rec, reason)
	}
	if err := kafkaname.Topic(rec.Topic); err != nil {
		// Before anything is handed to librdkafka: its Go client panics on a name over 512
		// bytes (the topic lookup of a metadata request or a produce), the broker refuses the
		// others.
		return s.park(ctx, at, rec, "the topic name is "+err.Error())
	}
	n := s.k.topicPartitions(rec.Topic)
	switch {
	case n < 0:
		return s.park(ctx, at, rec, fmt.Sprintf("topic %s does not exist", rec.Topic))
	case rec.Partition != nil && n > 0 && int(*rec.Partition) >= n:
		return s.park(ctx, at, rec, fmt.Sprintf("topic %s has %d partitions, the record names partition %d", rec.Topic, n, *rec.Partition))
	}
	lim := s.k.topicLimits(ctx, rec.Topic)
	if err := lim.RefusesNilKey(rec.Key); err != nil {
		// The broker would refuse it (INVALID_RECORD) and abort the Kafka transaction.
		return s.park(ctx, at, rec, err.Error())
	}
	if limit := lim.MaxMessageBytes; limit > 0 {
		if size := recordSize(&rec); size > limit {
			return s.park(ctx, at, rec, fmt.Sprintf("record of about %d bytes over topic %s's max.message.bytes %d", size, rec.Topic, limit))
		}
		if limit < s.k.batch {
			// The broker refuses a whole batch over the topic's limit, so batches must stay
			// under the smallest limit: a producer with a smaller batch.size publishes the
			// same transactions again.
			s.r.batchSize.Store(int64(limit))
			s.r.log.Info("a topic's max.message.bytes is below the producer's batch.size: reconnecting with batch.size lowered to it",
				zap.String("topic", rec.Topic), zap.Int("max_message_bytes", limit), zap.Int("batch_size", s.k.batch))
			return errBatchSize
		}
	}
	hook("after-decode")
	if !s.kOpen {
		if err := s.k.p.BeginTransaction(); err != nil {
			return fmt.Errorf("walrelay: begin Kafka transaction: %w", err)
		}
		s.kOpen, s.kRecords, s.kFirst = true, 0, time.Now()
	}
	hs := s.headers[:0]
	for _, h := range rec.Headers {
		if h.Key != outbox.HeaderOutboxID && h.Key != HeaderPosition && h.Key != outbox.HeaderSourceID {
			hs = append(hs, kafka.Header{Key: h.Key, Value: h.Value})
		}
	}
	// Produce copies headers, key and value into librdkafka before it returns, so without
	// delivery reports (which keep the message) the buffers and the message are reused.
	id := recordID(s.txSrc, at, &rec)
	s.idBuf = appendUUID(s.idBuf[:0], id)
	s.posBuf = appendPosition(s.posBuf[:0], at)
	hs = append(hs, kafka.Header{Key: outbox.HeaderOutboxID, Value: s.idBuf}, kafka.Header{Key: HeaderPosition, Value: s.posBuf})
	s.headers = hs
	if s.topic != rec.Topic {
		s.topic = rec.Topic
	}
	m := &s.msg
	if s.k.reports {
		m = &kafka.Message{}
		hs = append([]kafka.Header(nil), hs...)
		hs[len(hs)-2].Value = []byte(id.String())
		hs[len(hs)-1].Value = append([]byte(nil), s.posBuf...)
		m.Opaque = &at
	}
	*m = kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &s.topic, Partition: kafka.PartitionAny},
		Key: rec.Key, Value: rec.Value, Headers: hs, Opaque: m.Opaque}
	if rec.Partition != nil {
		m.TopicPartition.Partition = *rec.Partition
	}
	for {
		err := s.k.p.Produce(m, nil)
		if err == nil {
			break
		}
		var ke kafka.Error
		if errors.As(err, &ke) && ke.Code() == kafka.ErrQueueFull {
			// Memory stays bounded (queue.buffering.max.messages): wait for deliveries.
			tf := time.Now()
			s.k.p.Flush(10)
			s.r.steps.queueFull.Add(int64(time.Since(tf)))
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if errors.As(err, &ke) && refused(ke.Code()) {
			return s.park(ctx, at, rec, ke.Error())
		}
		return fmt.Errorf("walrelay: produce to %s: %w", rec.Topic, err)
	}
	if s.k.reports {
		s.k.produced.Add(1)
	}
	hook("after-produce")
	if s.k.reports && s.isolated(at) {
		// A suspect of a refused batch: alone in its batch, its own delivery says.
		s.k.p.Flush(30000)
		s.k.waitReported(5 * time.Second)
		s.r.mu.Lock()
		delete(s.r.isolate, at)
		s.r.mu.Unlock()
		s.k.mu.Lock()
		f := s.k.failure
		s.k.mu.Unlock()
		if f != nil && f.at == at {
			return s.abortOpen(errRestart)
		}
	}
	s.kRecords++
	s.txOurs++
	return nil
}

// commit closes the open Kafka transaction with its checkpoint, then confirms its end.
func (s *stream) commit(ctx context.Context) error {
	cp, _ := json.Marshal(checkpoint{CommitLSN: s.kLastCommit.String(), Timeline: s.tl.of(s.kLastCommit), SystemID: s.sysID, At: time.Now().UTC()})
	t := s.r.cfg.CheckpointTopic
	err := s.k.p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &t, Partition: 0}, Key: s.k.key, Value: cp}, nil)
	if err != nil {
		return s.abortOpen(fmt.Errorf("walrelay: produce checkpoint: %w", err))
	}
	if s.k.reports {
		s.k.produced.Add(1)
	}
	// Nothing is published that a synchronous standby does not have (awaitStandbys).
	if err := s.r.awaitStandbys(ctx); err != nil {
		return s.abortOpen(err)
	}
	hook("before-kafka-commit")
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	tc := time.Now()
	awaited := s.k.reach.Await() // Ready: a broker that does not answer (frozen, cut off)
	// librdkafka's commit takes a deadline, not a cancellation: a stop waits for a commit in
	// progress (60 s at most). It cannot be left behind: closing the producer while it runs
	// aborts the process (rd_kafka_txn_op_req0: "rk_ops queue disabled").
	err = s.k.p.CommitTransaction(cctx)
	cancel()
	// A retriable failure (librdkafka: the API timeout passed while the commit still flushes,
	// a broker down) leaves the commit running inside librdkafka with its outcome unknown: it
	// may still commit. librdkafka's contract is to call CommitTransaction again until it
	// succeeds or fails for good; an abort is refused meanwhile ("Conflicting
	// commit_transaction API call is already in progress"). Abandoning the producer then and
	// streaming again from the checkpoint published the transaction twice when it did commit
	// after all (a fresh-eyes attack: broker SIGKILLs mid-commit, 2 of 4 runs with duplicates
	// under read_committed). So wait for the outcome, as long as the relay is not stopping.
	for err != nil && retriable(err) && !s.stopping() {
		s.r.log.Warn("the Kafka transaction's commit has not finished; waiting for its outcome (its records may already be committed)",
			zap.Int("records", s.kRecords), zap.Error(err))
		cctx, cancel = context.WithTimeout(ctx, 60*time.Second)
		err = s.k.p.CommitTransaction(cctx)
		cancel()
	}
	awaited()
	if err == nil {
		s.k.reach.Up()
	}
	s.r.steps.commit.Add(int64(time.Since(tc)))
	if err != nil {
		if !s.k.reports {
			// Without delivery reports the refused record, if any, is unknown: the next
			// stream publishes the same transactions again with reports on, to find it.
			s.r.diagnose.Store(true)
		}
		return s.abortOpen(fmt.Errorf("walrelay: commit Kafka transaction: %w", err))
	}
	hook("after-kafka-commit")
	if f := s.r.parkFail.Load(); f != nil && f.at.commit <= s.kLastCommit {
		s.r.parkFail.CompareAndSwap(f, nil) // the stream got past the record
	}
	s.r.published.Add(int64(s.kRecords))
	s.r.transactions.Add(1)
	s.kOpen, s.kRecords = false, 0
	s.ckpt = s.kLastCommit
	s.advance(s.kLastEnd)
	return s.sendStatus(false)
}

// stopping reports whether the relay is being stopped (run's context is done).
func (s *stream) stopping() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// abortOpen aborts the open Kafka transaction, if any, and returns err — or errRestart when a
// record in it was refused (recorded so the next stream parks it).
func (s *stream) abortOpen(err error) error {
	if !s.kOpen {
		return err
	}
	s.kOpen = false
	if s.k.reports {
		s.k.waitReported(5 * time.Second)
	}
	// A stop does not wait the full 30 s for a broker that does not answer: the transaction
	// left open is aborted by the next producer's InitTransactions (the zombie fence).
	abortWait := 30 * time.Second
	if s.stopping() {
		abortWait = publish.CloseWait
	}
	actx, cancel := context.WithTimeout(context.Background(), abortWait)
	defer cancel()
	if aerr := s.k.p.AbortTransaction(actx); aerr != nil {
		s.r.log.Warn("abort Kafka transaction", zap.Error(aerr))
	}
	if f := s.k.takeFailure(); f != nil && refused(f.err.Code()) && f.at.commit != 0 {
		class, _ := publish.ClassifyCode(f.err.Code(), len(f.all) <= 1)
		if class == publish.Isolate {
			// The broker refused a batch: which of its records is at fault is unknown. The
			// next stream produces each of them alone, waiting for its delivery.
			s.r.mu.Lock()
			for _, at := range f.all {
				s.r.isolate[at] = true
			}
			s.r.mu.Unlock()
			s.r.diagnose.Store(true)
			s.r.log.Warn("the broker refused a batch: publishing its records one at a time to find the one it refuses",
				zap.Int("records", len(f.all)), zap.Error(f.err))
			return errRestart
		}
		if len(f.all) > 1 {
			// A refusal of the topic or partition (publish: Park): each record of it is refused.
			s.r.mu.Lock()
			for _, at := range f.all {
				s.r.refuse[at] = f.err.Error()
			}
			s.r.mu.Unlock()
		}
		s.r.mu.Lock()
		s.r.refuse[f.at] = f.err.Error()
		s.r.mu.Unlock()
		s.r.log.Warn("the broker refused a record: its Kafka transaction is aborted and published again without it; the record is parked",
			zap.Stringer("commit_lsn", f.at.commit), zap.Uint32("position", f.at.pos), zap.Error(f.err))
		return errRestart
	}
	return err
}

// advance moves the position confirmed to the server (never back) and what Pending sees.
func (s *stream) advance(l pglogrepl.LSN) {
	if l > s.confirmed {
		s.confirmed = l
	}
	if uint64(l) > s.r.caughtUp.Load() {
		s.r.caughtUp.Store(uint64(l))
	}
}

// sendStatus reports the confirmed position as written and flushed (the slot may drop WAL
// before it); reply asks the server for a keepalive with its position.
func (s *stream) sendStatus(reply bool) error {
	hook("before-confirm")
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, WALFlushPosition: s.confirmed, WALApplyPosition: s.confirmed, ReplyRequested: reply})
	if err != nil {
		return fmt.Errorf("walrelay: send status: %w", err)
	}
	s.sent = s.confirmed
	return nil
}

// park stores a record that cannot be published as a parked row of the outbox table (where
// kafkatx outbox parked|release|discard see it), once per identity, and goes on without it.
// The key's later records are not held behind it: they are published, and a release
// publishes it after them.
func (s *stream) park(ctx context.Context, at position, rec outbox.Record, reason string) error {
	id := recordID(s.txSrc, at, &rec)
	var hk, hv [][]byte
	hk, hv = [][]byte{}, [][]byte{}
	for _, h := range rec.Headers {
		if h.Key == outbox.HeaderSourceID {
			continue // the row's outbox_id holds it
		}
		v := h.Value
		if v == nil {
			v = []byte{}
		}
		hk, hv = append(hk, []byte(h.Key)), append(hv, v)
	}
	topic := rec.Topic
	if !utf8.ValidString(topic) || strings.ContainsRune(topic, 0) {
		// A message written with pg_logical_emit_message may name any bytes; the topic column
		// is text.
		topic = pg.SanitizeText(topic, 3*len(topic))
	}
	t := tables.For(s.r.cfg.Schema).Outbox
	tag, err := s.r.pool.Exec(ctx, `INSERT INTO `+t+` (outbox_id, topic, key, value, partition, header_keys, header_values, state, attempts, last_error, parked_at)
		SELECT $1, $2, $3, $4, $5, $6, $7, 'parked', 1, $8, now()
		WHERE NOT EXISTS (SELECT 1 FROM `+t+` WHERE outbox_id = $1)`, id, topic, rec.Key, rec.Value, rec.Partition, hk, hv, reason)
	if err != nil {
		s.r.parkFailed(at, rec.Topic, err)
		return fmt.Errorf("walrelay: park record %s#%d: %w", at.commit, at.pos, err)
	}
	s.r.parkFail.Store(nil)
	if tag.RowsAffected() > 0 {
		s.r.parked.Add(1)
		s.r.log.Error("record parked: the broker cannot take it; later records of its key are published without waiting for it (kafkatx outbox parked|release|discard)",
			zap.String("topic", rec.Topic), zap.String("outbox_id", id.String()), zap.Stringer("commit_lsn", at.commit), zap.Uint32("position", at.pos),
			zap.String("reason", reason))
	}
	s.r.mu.Lock()
	delete(s.r.refuse, at)
	s.r.mu.Unlock()
	return nil
}

// recordSize estimates rec's size in a record batch: its bytes, its headers and the batch's
// own framing (61 bytes) with room for the record's varints.
func recordSize(rec *outbox.Record) int {
	n := 61 + 32 + len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n + 2*80 // the two headers the relay adds
}

// isolated reports whether at is a suspect of a refused batch.
func (s *stream) isolated(at position) bool {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	return s.r.isolate[at]
}

// retriable reports whether err is a librdkafka error the same call may be retried on
// (kafka.Error.IsRetriable): for CommitTransaction, an outcome not known yet.
func retriable(err error) bool {
	var ke kafka.Error
	return errors.As(err, &ke) && ke.IsRetriable() && !ke.IsFatal() && !ke.TxnRequiresAbort()
}
