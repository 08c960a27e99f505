package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/pg"
)

// Parked keys (Settings.ParkKeys; issue "A key in trouble waits alone"). A message whose
// handling is to be retried — it failed and has attempts left, or its dependency answered
// Unavailable for it — is parked instead of holding its lane: a unit transaction writes its
// row (internal/parking, table key_parking) and records its offset done as the lane's units
// do (laneMode.finish: done_offsets, fenced on the watermark; serialMode.finish: the
// watermark's advance), so the watermark passes it and the partition's other keys go on.
// Every later message of a parked key is parked the same way without running (parkBehind),
// so a key's messages never run out of offset order. The partition's retrier (retryParked, one
// goroutine per worker) runs each parked key's head — its lowest parked offset — at its next
// try, in a transaction that holds the handler's effects and deletes the head's row
// (parking.Store.TakeTx: the fence against a second owner); a head that exhausts MaxAttempts is
// dead-lettered in a transaction that deletes its row; an Unavailable answer spends no attempt
// (until Settings.UnavailableMaxWait since the head's first failure, as in the lanes). When a
// head is done the key's next parked message becomes its head, due at once.
//
// Key trouble, not shared trouble: a failure parks its key only while the breaker is closed
// and the failure is not the database's (a *pgconn.PgError in the handler's error, or the
// server's own condition): a database refusing writes, or a far side down for everyone, is met
// by every key, and parking them one by one would only move the whole partition into the
// table. Failures that park count in the breaker as they do without parking, and so do
// Unavailable answers, which otherwise never count, all alike whatever their text
// (errUnavailableAlike): distinct messages failing alike with no commit between open it at
// Settings.BreakerThreshold (default 3), and from then on the partition is
// held as before — at most threshold-1 keys parked by a shared failure, none once it is open.
// One key's failures never open it: the other keys' commits close each spell.
//
// Memory stays flat: a worker holds the parked keys' hashes and counts (parkedKeys), loaded at
// assignment and after a fence; the messages themselves stay in PostgreSQL.

// parkedKeys is a partition's parked keys in memory: the number of parked messages of each key
// (by parking.KeyHash), counted under one lock with the parking transactions in flight, so a
// key is never seen empty while a message of it is being parked (a read of the table could
// miss a parking transaction not committed yet).
type parkedKeys struct {
	mu      sync.Mutex
	n       map[string]int
	total   int
	pending int    // parking transactions in flight
	gen     uint64 // bumped when a parking or a take commits
	wake    chan struct{}
}

func newParkedKeys(counts map[string]int) *parkedKeys {
	k := &parkedKeys{n: map[string]int{}, wake: make(chan struct{}, 1)}
	k.load(counts)
	return k
}

func (k *parkedKeys) load(counts map[string]int) {
	k.n, k.total = map[string]int{}, 0
	for h, c := range counts {
		if c > 0 {
			k.n[h] = c
			k.total += c
		}
	}
}

// messages is how many messages are parked (or being parked).
func (k *parkedKeys) messages() int {
	if k == nil {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.total
}

// reserve counts one more parked message of key h, as a parking transaction starts: behind
// (the key has parked messages: the message goes behind them) or as the key's head. It
// returns ok false when the key is not parked and behind, or when a bound holds: the key has
// maxPerKey messages (full), or a new key would pass maxKeys.
func (k *parkedKeys) reserve(h string, behind bool, maxPerKey, maxKeys int) (ok, full bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.n[h]
	switch {
	case behind && c == 0:
		return false, false
	case c == 0 && maxKeys > 0 && len(k.n) >= maxKeys:
		return false, true
	case c > 0 && maxPerKey > 0 && c >= maxPerKey:
		return false, true
	}
	k.n[h] = c + 1
	k.total++
	k.pending++
	return true, false
}

// parked ends a parking transaction of key h: committed, or not (its count given back).
func (k *parkedKeys) parked(h string, committed bool) {
	k.mu.Lock()
	k.pending--
	if committed {
		k.gen++
	} else {
		k.drop(h)
	}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// taken counts a parked message of key h gone: run, dead-lettered, or taken by an operator.
func (k *parkedKeys) taken(h string) {
	k.mu.Lock()
	k.gen++
	k.drop(h)
	k.mu.Unlock()
}

func (k *parkedKeys) drop(h string) {
	if c := k.n[h]; c > 1 {
		k.n[h] = c - 1
	} else if c == 1 {
		delete(k.n, h)
	} else {
		return
	}
	k.total--
}

func (k *parkedKeys) has(h string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[h] > 0
}

// snapshot returns the generation to reconcile against, or ok false while a parking
// transaction is in flight.
func (k *parkedKeys) snapshot() (gen uint64, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen, k.pending == 0
}

// reconcile replaces the counts with counts read from the table after snapshot gave gen,
// unless a parking or a take committed since or one is in flight (then the next look does it):
// an operator's release or dead-letter of a key is seen so.
func (k *parkedKeys) reconcile(gen uint64, counts map[string]int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen || k.pending != 0 {
		return
	}
	k.load(counts)
}

// parkCause is why a message of a failed batch parks when it runs alone next (runOne).
type parkCause struct {
	cause       error
	unavailable bool // an Unavailable answer: no attempt spent
}

// parkLater notes that km, the failing message of a batch (cause), parks when it runs alone.
func (u *lane) parkLater(km *kafka.Message, cause error, unavailable bool) {
	if u.toPark == nil {
		u.toPark = map[int64]parkCause{}
	}
	u.toPark[int64(km.TopicPartition.Offset)] = parkCause{cause: cause, unavailable: unavailable}
}

// parksNext reports whether km is a failed batch's message that parks when it runs alone.
func (u *lane) parksNext(km *kafka.Message) bool {
	_, ok := u.toPark[int64(km.TopicPartition.Offset)]
	return ok
}

// errUnavailableAlike is what the breaker counts for an Unavailable answer that would park its
// key: every Unavailable answer is alike, whatever its text, since a far side down for
// everyone answers each message with its own words (a run id, a URL, a tenant) that the
// breaker's signature of an error text would keep apart.
var errUnavailableAlike = errors.New("a dependency answered Unavailable (kafkatx.Unavailable) for several keys with no success between")

// errPark ends a unit whose message at index at answered Unavailable for its key alone, with
// parking allowed: the caller parks the message (no attempt spent) instead of waiting.
type errPark struct {
	cause error
	at    int
}

func (e *errPark) Error() string { return e.cause.Error() }
func (e *errPark) Unwrap() error { return e.cause }

// KeyFailure reports whether a failure err of a message may park its key (with parking on and
// the breaker closed): it is not the database's (sharedFailure). The loop and the test kit
// (kafkatxtest) both ask it.
func KeyFailure(err error) bool { return !sharedFailure(err) }

// sharedFailure reports whether err is the database's rather than one key's: a PostgreSQL
// error anywhere in its chain (a refused write, a revoked privilege, a constraint the whole
// table now meets), or the server's own condition. Such failures never park (park.go).
func sharedFailure(err error) bool {
	if err == nil {
		return false
	}
	if _, server := ServerCondition(err); server {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// mayPark reports whether a failure cause of a message may park its key: parking is on, the
// breaker is closed and the failure is not the database's (sharedFailure).
func (u *lane) mayPark(cause error) bool {
	p := u.p
	return p.set.ParkKeys && p.parked != nil && KeyFailure(cause) && p.breaker.State() == nil
}

// keyHash is km's key identity for parking.
func keyHash(km *kafka.Message) string {
	return string(parking.KeyHash(km.Key, int64(km.TopicPartition.Offset)))
}

// keyParked reports whether km's key has parked messages (its messages then park behind).
func (u *lane) keyParked(km *kafka.Message) bool {
	return u.p.set.ParkKeys && u.p.parked != nil && km.Key != nil && u.p.parked.has(keyHash(km))
}

// parkBehind parks km behind its key's parked messages without running it; when the key's
// messages are all done meanwhile, it runs km (runOne). A key at Settings.ParkMaxPerKey holds
// km in its lane until the retrier frees room: the key's order is kept and nothing is
// dead-lettered for the trouble of the messages before it; the lane (at Concurrency 1 the
// partition) waits meanwhile, logged as "blocked by key K at offset X" and seen by the stall
// watchdog.
func (u *lane) parkBehind(km *kafka.Message) error {
	h, off := keyHash(km), int64(km.TopicPartition.Offset)
	for blocked := false; ; {
		ok, full := u.p.parked.reserve(h, true, u.p.set.ParkMaxPerKey, 0)
		if ok {
			return u.parkTx(km, h, parking.Message{}, false)
		}
		if !full {
			return u.runOne(km)
		}
		if !blocked {
			blocked = true
			u.p.log.Warn(fmt.Sprintf("blocked by key %s at offset %d: the key has %d parked messages (Config.Park.MaxPerKey); its lane waits for the key's head to be done",
				keyText(km.Key), off, u.p.set.ParkMaxPerKey), zap.Int64("offset", off))
		}
		if err := u.waits.sleep(u.p.set.BreakerProbe); err != nil {
			return err
		}
	}
}

// parkHead parks km, whose try failed with cause after attempt a (unavailable: an
// Unavailable answer, no attempt spent), as its key's head, due after the backoff. ok is false
// when a bound refuses a new parked key (Settings.ParkMaxKeys): the caller then retries km in
// place as without parking, and the partition's stall is reported as blocked by km's key.
func (u *lane) parkHead(km *kafka.Message, a offsetstore.Attempt, cause error, unavailable bool) (ok bool, err error) {
	h, off := keyHash(km), int64(km.TopicPartition.Offset)
	if ok, _ := u.p.parked.reserve(h, false, u.p.set.ParkMaxPerKey, u.p.set.ParkMaxKeys); !ok {
		if !u.blockedWarned {
			u.blockedWarned = true
			u.p.log.Warn(fmt.Sprintf("blocked by key %s at offset %d: the partition has %d parked keys (Config.Park.MaxKeys); the message is retried in place, holding its lane",
				keyText(km.Key), off, u.p.set.ParkMaxKeys), zap.Int64("offset", off))
		}
		return false, nil
	}
	u.blockedWarned = false
	class, msg, _ := Describe(cause)
	now := time.Now()
	d := u.p.set.Backoff(max(a.Attempts, 1))
	if unavailable {
		d = u.p.set.UnavailableBackoff(1)
	}
	first := a.FirstFailureAt
	if first.IsZero() {
		first = now
	}
	m := parking.Message{Attempts: a.Attempts, FirstFailureAt: first, ErrorClass: class, LastError: msg, NextTry: now.Add(d)}
	u.p.log.Info("key parked: its message waits in the database, the partition's other keys go on",
		zap.Int64("offset", off), zap.Int("attempt", a.Attempts), zap.String("error_class", class),
		zap.String("error", pg.SanitizeText(msg, 512)), zap.Duration("next_try_in", d))
	return true, u.parkTx(km, h, m, true)
}

// parkTx writes km's parked row (m's attempt state) and records its offset done through the
// lane's mode, in one transaction run until it commits or is fenced; the count reserved for h
// is given back when it does not commit.
func (u *lane) parkTx(km *kafka.Message, h string, m parking.Message, head bool) error {
	off := int64(km.TopicPartition.Offset)
	m.Group, m.Topic, m.Partition, m.Offset = u.p.group, u.p.tp.Topic, u.p.tp.Partition, off
	m.TopicID, m.ClusterID, m.KeyHash = u.p.logID, u.p.logCluster, []byte(h)
	m.Key, m.Value, m.Timestamp = km.Key, km.Value, km.Timestamp
	for _, hd := range km.Headers {
		m.Headers = append(m.Headers, parking.Header{Key: hd.Key, Value: hd.Value})
	}
	err := u.waits.untilDone(off, func() error {
		ctx := u.p.workCtx
		tx, err := u.p.begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := u.p.parkStore.ParkTx(ctx, tx, m); err != nil {
			return err
		}
		u.p.set.Signals.step("park", off)
		return u.mode.finish(ctx, u, tx, finish{msgs: []*kafka.Message{km}, end: off + 1, clearAttempts: true})
	})
	u.p.parked.parked(h, err == nil)
	if err != nil {
		return err
	}
	u.p.dropAttempt(off)
	u.waits.available(false)
	if !head {
		u.p.log.Debug("message parked behind its key's parked messages", zap.Int64("offset", off))
	}
	return nil
}

// keyText is a key as a log line shows it: sanitized, at most 64 bytes, "(nil)" for none.
func keyText(key []byte) string {
	if key == nil {
		return "(nil)"
	}
	return fmt.Sprintf("%q", pg.SanitizeText(string(key), 64))
}

// parkReconcileEvery is how often the retrier reads the parked keys' counts again, to see an
// operator's release or dead-letter of a key (parking.Store.TakeKeyTx).
const parkReconcileEvery = 5 * time.Second

// parkLookEvery bounds the retrier's wait between two looks for due heads while keys are
// parked (an operator's release is seen within it).
const parkLookEvery = time.Second

// retryParked is the partition's retrier: it runs the due heads of its parked keys until stop
// is closed or the worker's work is aborted.
func (p *worker) retryParked(stop <-chan struct{}) {
	lastReconcile := time.Now()
	unavail := map[int64]int{} // consecutive Unavailable answers of a head, by offset
	for {
		if p.workCtx.Err() != nil {
			return
		}
		if time.Since(lastReconcile) >= parkReconcileEvery && p.parked.messages() > 0 {
			lastReconcile = time.Now()
			if gen, ok := p.parked.snapshot(); ok {
				if counts, err := p.parkStore.Counts(p.workCtx, p.pool, p.group, p.tp.Topic, p.tp.Partition); err == nil {
					p.parked.reconcile(gen, counts)
				}
			}
		}
		wait, failing := parkLookEvery, false
		if p.parked.messages() > 0 {
			due, err := p.parkStore.Due(p.workCtx, p.pool, p.group, p.tp.Topic, p.tp.Partition, time.Now(), 64)
			if err != nil {
				if p.workCtx.Err() != nil {
					return
				}
				p.log.Warn("read due parked keys; trying again", zap.Error(err))
				failing = true
			}
			for _, m := range due {
				select {
				case <-stop:
					return
				default:
				}
				again, err := p.runHead(stop, m, unavail)
				if err != nil {
					if errors.Is(err, errStopped) || p.workCtx.Err() != nil {
						return
					}
					p.log.Warn("parked key's head: database error; trying again later (not an attempt)", zap.Int64("offset", m.Offset), zap.Error(err))
					failing = true
				}
				if again {
					wait = 0 // its key's next message is due at once
				}
			}
			if failing { // the database's trouble: look again after parkLookEvery, not at once
				wait = parkLookEvery
			} else if wait > 0 {
				if next, err := p.parkStore.NextDue(p.workCtx, p.pool, p.group, p.tp.Topic, p.tp.Partition); err == nil && !next.IsZero() {
					wait = min(wait, max(time.Until(next), 10*time.Millisecond))
				}
			}
		}
		if wait <= 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-p.parked.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// runHead runs parked head m once: its handler and the delete of its row in one transaction;
// a failure counted on its row, or its dead letter when it has no attempt left. next is true
// when the head is gone (its key's next message, if any, is due at once).
func (p *worker) runHead(stop <-chan struct{}, m parking.Message, unavail map[int64]int) (next bool, err error) {
	ctx := p.workCtx
	topic := p.tp.Topic
	km := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: p.tp.Partition, Offset: kafka.Offset(m.Offset)},
		Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	for _, h := range m.Headers {
		km.Headers = append(km.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	h := string(m.KeyHash)
	a := offsetstore.Attempt{Offset: m.Offset, Attempts: m.Attempts, FirstFailureAt: m.FirstFailureAt, LastFailureAt: time.Now(),
		ErrorClass: m.ErrorClass, ErrorMessage: m.LastError}
	if GiveUp(m.ErrorClass, m.Attempts, p.set.MaxAttempts) {
		return p.deadLetterHead(km, h, a)
	}
	if err := p.gate.enter(stop); err != nil { // a crash probe runs alone in the process (isolate.go)
		return false, err
	}
	defer p.gate.leave()
	// Durable before the handler runs: a crash during this try is the message's own attempt.
	if err := p.parkStore.BeginTry(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, m.Attempts+1); err != nil {
		if errors.Is(err, parking.ErrGone) {
			p.parked.taken(h)
			return true, nil
		}
		return false, err
	}
	start := time.Now()
	tx, t, err := p.body.TryRecords(ctx, p.begin, p.scopes(), []*kafka.Message{km}, m.Attempts+1)
	if tx != nil {
		defer tx.Rollback(context.WithoutCancel(ctx))
	}
	if err != nil {
		p.restoreTry(m)
		return false, err
	}
	switch t.Verdict {
	case Done:
		p.set.Signals.step("handled", m.Offset)
		if err := p.parkStore.TakeTx(ctx, tx, p.group, p.tp.Topic, p.tp.Partition, m.Offset); err != nil {
			if errors.Is(err, parking.ErrGone) {
				p.parked.taken(h) // another owner or an operator took it
				return true, nil
			}
			p.restoreTry(m)
			return false, err
		}
		if err := tx.Commit(ctx); err != nil && !p.headGone(m.Offset) {
			p.restoreTry(m)
			return false, err
		}
		delete(unavail, m.Offset)
		p.parked.taken(h)
		p.set.Signals.step("parked-done", m.Offset)
		p.lastCommit.Store(time.Now().UnixNano())
		p.breaker.succeeded()
		p.emit.BatchCommitted(p.tp, m.Offset, m.Offset+1, t, time.Since(start))
		p.log.Info("parked message done", zap.Int64("offset", m.Offset), zap.Int("attempt", m.Attempts+1))
		return true, nil
	case Again:
		return false, p.parkStore.Failed(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, m.Attempts, m.ErrorClass, m.LastError,
			time.Now().Add(p.set.Backoff(1)))
	}
	cause := t.Cause
	if cause == nil {
		cause = t.Err
	}
	class, msg, _ := Describe(cause)
	held := t.Verdict == Wait && (m.FirstFailureAt.IsZero() || time.Since(m.FirstFailureAt) < p.set.UnavailableMaxWait)
	if !held && t.Verdict == Failed && PermanentCause(cause) == nil {
		held = p.breaker.failed(Position{TP: p.tp, Offset: m.Offset}, cause, false) // the open breaker holds it: no attempt
	}
	if held {
		unavail[m.Offset]++
		d := p.set.UnavailableBackoff(min(unavail[m.Offset], 16))
		p.emit.DependencyUnavailable(p.tp, m.Offset, m.FirstFailureAt, d)
		return false, p.parkStore.Failed(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, m.Attempts, class, msg, time.Now().Add(d))
	}
	delete(unavail, m.Offset)
	n := m.Attempts + 1
	p.log.Info("parked message failed", zap.Int64("offset", m.Offset), zap.Int("attempt", n), zap.String("error_class", class),
		zap.String("error", pg.SanitizeText(msg, 512)))
	if GiveUp(class, n, p.set.MaxAttempts) {
		a.Attempts, a.ErrorClass, a.ErrorMessage, a.LastFailureAt = n, class, msg, time.Now()
		if a.FirstFailureAt.IsZero() {
			a.FirstFailureAt = a.LastFailureAt
		}
		_, _, a.Stack = Describe(cause)
		if tx != nil {
			tx.Rollback(context.WithoutCancel(ctx))
		}
		// Counted first: a dead letter that cannot be written now is written at the next look.
		if err := p.parkStore.Failed(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, n, class, msg, time.Now()); err != nil {
			return false, err
		}
		return p.deadLetterHead(km, h, a)
	}
	d := p.set.Backoff(n)
	p.emit.RetryScheduled(p.tp, m.Offset, n, class, d)
	return false, p.parkStore.Failed(ctx, p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, n, class, msg, time.Now().Add(d))
}

// restoreTry gives back the attempt BeginTry counted for a try of head m that ended on the
// loop's own trouble (a database error), not the handler's answer.
func (p *worker) restoreTry(m parking.Message) {
	_ = p.parkStore.Failed(context.WithoutCancel(p.workCtx), p.pool, p.group, p.tp.Topic, p.tp.Partition, m.Offset, m.Attempts,
		m.ErrorClass, m.LastError, time.Now().Add(p.set.Backoff(1)))
}

// headGone reads whether parked offset's row is gone, settling a COMMIT whose answer was lost
// (the row is deleted only by a transaction that applied or dead-lettered it).
func (p *worker) headGone(offset int64) bool {
	offs, err := p.parkStore.Offsets(context.WithoutCancel(p.workCtx), p.pool, p.group, p.tp.Topic, p.tp.Partition, offset, offset+1)
	return err == nil && len(offs) == 0
}

// deadLetterHead dead-letters parked head km after attempt a and deletes its row, in one
// transaction; an error leaves the row for the next look.
func (p *worker) deadLetterHead(km *kafka.Message, h string, a offsetstore.Attempt) (bool, error) {
	off := int64(km.TopicPartition.Offset)
	var hs []dlq.Header
	for _, hd := range km.Headers {
		hs = append(hs, dlq.Header{Key: hd.Key, Value: hd.Value})
	}
	d := NewDeadLetter(p.group, idempotency.Message{Topic: p.tp.Topic, Partition: p.tp.Partition, Offset: off, Key: km.Key, Value: km.Value},
		km.Timestamp, hs, a, p.epoch)
	ctx := p.workCtx
	tx, err := p.begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := DeadLetterTx(ctx, tx, p.set.Schema, d, p.set.DeadLetterTopic); err != nil {
		return false, err
	}
	if err := p.parkStore.TakeTx(ctx, tx, p.group, p.tp.Topic, p.tp.Partition, off); err != nil {
		if errors.Is(err, parking.ErrGone) {
			p.parked.taken(h)
			return true, nil
		}
		return false, err
	}
	p.set.Signals.step("dead-letter", off)
	if err := tx.Commit(ctx); err != nil && !p.headGone(off) {
		return false, err
	}
	p.parked.taken(h)
	p.emit.DeadLettered(p.tp, off, d.Attempts, d.ErrorClass)
	p.log.Warn("parked message dead-lettered", zap.Int64("offset", off), zap.Int("attempt", d.Attempts),
		zap.String("error_class", d.ErrorClass), zap.String("error", pg.SanitizeText(d.ErrorMessage, 512)))
	return true, nil
}
