package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
	"github.com/kafkatx/kafkatx/pg"
)

// row is one pending outbox row.
type row struct {
	id        int64
	commitSeq int64
	txid      uint64 // the writing transaction (xid8): with id, the row's place in outbox_open_idx
	outboxID  string
	topic     string
	key       []byte
	value     []byte
	hk, hv    [][]byte
	partition *int32
	createdAt time.Time
	// pack is the id of the packed row the record was read from (0: a plain row); id is
	// then the record's own id (pack_ids), under which it becomes a plain row if it is not
	// delivered (packs.go). behindParked: a record of a pack whose (topic, key) has a parked
	// row; it waits (a plain row's read leaves such rows out).
	pack         int64
	behindParked bool
}

// pos is the row's place in the table: the packed row's id for a record of a pack.
func (w *row) pos() int64 {
	if w.pack != 0 {
		return w.pack
	}
	return w.id
}

// keyID identifies a (topic, key) for per-key order; nil keys have no order.
type keyID struct{ topic, key string }

func (w *row) keyID() (keyID, bool) {
	if w.key == nil {
		return keyID{}, false
	}
	return keyID{w.topic, string(w.key)}, true
}

// result is what happened to one row in a round.
type result struct {
	outcome outcome
	err     error
}

// roundResult summarizes a round for the leader loop.
type roundResult struct {
	rows  int  // rows read
	full  bool // a full batch was read: more may wait
	retry bool // some row failed with a retriable error: back off
	// fenced: the leadership session was checked in this round, right before producing.
	fenced bool
}

// errFenced wraps the leadership session's answer when a round's fence refused: the session
// ended or is read-only. The leader stops leading.
var errFenced = errors.New("relay: the leadership session refused the round")

// round reads one batch of pending rows in publication order, produces them all without
// waiting per record, waits for their delivery reports, and starts marking the outcomes in
// one database transaction, which runs while the next round reads and produces (marker).
// After a full batch it reads the next one while this one is produced (readAhead).
//
// fence checks the leadership session (requireWritable) right before anything is produced,
// after the read and after any wait for the previous mark, so a leader whose session ended
// or turned read-only while it waited produces nothing more; its error is returned wrapped
// in errFenced.
func (r *Relay) round(ctx context.Context, p *producer, fence func(context.Context) error) (roundResult, error) {
	m := &r.marker
	var rt Round // the round's steps, reported when it produced (roundDone)
	t := time.Now()
	if m.afterSeq == 0 {
		// Reading from the head: the previous round's mark must be in first. When it failed
		// (the database refused, or is read-only), produce nothing this round: the leader
		// backs off and the rows are marked with the next one.
		if err := m.wait(); err != nil {
			return roundResult{retry: true}, fmt.Errorf("marking published rows failed; they are marked with the next round: %w", err)
		}
	}
	rt.MarkWait = time.Since(t)
	t = time.Now()
	skip := r.topics.excluded(p, r.cfg.UnknownTopicTimeout)
	rows, ahead := r.ahead.take(skip, m.afterSeq, m.afterID)
	var err error
	if !ahead {
		rows, err = r.fetch(ctx, skip, m.afterSeq, m.afterID)
	}
	rt.Read, rt.ReadAhead = time.Since(t), ahead
	if err != nil {
		m.fromHead()
		return roundResult{}, err
	}
	res := roundResult{rows: len(rows), full: len(rows) >= r.cfg.BatchSize}
	if fetched := len(rows); fetched > 0 {
		if rows = m.dropCarried(rows); len(rows) == 0 {
			// Only rows of a failed mark, published already: mark them again, and back off
			// while the database refuses.
			if err := m.wait(); err == nil && len(m.carried) == 0 {
				return roundResult{rows: fetched, full: res.full}, nil // marked meanwhile
			}
			m.start(ctx, nil, nil)
			m.fromHead()
			return roundResult{rows: fetched, retry: true}, nil
		}
	}
	if len(rows) == 0 {
		m.fromHead()
		return res, nil
	}
	if err := fence(ctx); err != nil {
		m.fromHead()
		return roundResult{}, fmt.Errorf("%w: %w", errFenced, err)
	}
	res.fenced = true
	t = time.Now()
	if res.full {
		// More rows wait: read them while these are produced (readAhead).
		last := rows[len(rows)-1]
		r.ahead.start(ctx, skip, last.commitSeq, last.pos())
	}
	results := make([]result, len(rows))
	alone := false
	for _, w := range rows {
		if r.isolate[w.id] {
			alone = true
			break
		}
	}
	blocked := map[keyID]bool{} // keys with a failed row this round: their later rows wait
	for i := range rows {
		if rows[i].behindParked {
			k, _ := rows[i].keyID()
			blocked[k] = true
		}
	}
	topics := topicStates{} // each topic's state, looked up once a round
	if alone {
		// After a batch-level refusal: one record in flight at a time, so a refusal is the
		// record's own. Rare, and slow on purpose.
		for i := range rows {
			if ctx.Err() != nil {
				break
			}
			r.produce(ctx, p, rows[i:i+1], results[i:i+1], blocked, topics)
			if o := results[i].outcome; o != outcomeDelivered && o != outcomeNone {
				if k, ok := rows[i].keyID(); ok {
					blocked[k] = true
				}
			}
		}
	} else if r.ask(ctx, p, rows, time.Now()); r.limits.any(rows) {
		// A topic of this round takes smaller batches than librdkafka builds (split.go).
		r.produceChunked(ctx, p, rows, results, blocked, topics)
	} else {
		r.produce(ctx, p, rows, results, blocked, topics)
	}
	r.learnLimits(p, rows, results)
	for i, res2 := range results {
		if res2.outcome == outcomeDelivered || res2.outcome == outcomePark {
			delete(r.isolate, rows[i].id)
		}
		if res2.outcome == outcomeIsolate && !sizeRefusal(res2.err) {
			// Another record's refusal (INVALID_RECORD) may have failed the batch: each
			// such row goes alone until delivered or parked. Size refusals go in chunks.
			r.isolate[rows[i].id] = true
		}
		if res2.outcome == outcomeRetry || res2.outcome == outcomeIsolate {
			res.retry = res.retry || res2.outcome == outcomeRetry
		}
	}
	r.checkOrder(rows, results)
	if r.signals.beforeMark != nil {
		r.signals.beforeMark(results)
	}
	rt.Produce = time.Since(t)
	t = time.Now()
	prevErr := m.wait()
	rt.MarkWait += time.Since(t)
	rt.Rows = len(rows)
	r.roundDone(rt)
	m.start(ctx, rows, results)
	if prevErr != nil {
		return res, prevErr // wait read from the head again
	}
	m.advance(rows, results, res.full)
	return res, nil
}

// refusal is the outcome of a record of topic that librdkafka refused with err (alone: the
// only record of its partition in flight). A refusal as of an unknown topic or partition is
// checked with the broker (topics.vanished, once a round a topic; vanished holds the answers):
// a topic gone (deleted while the relay knew it) leaves the row pending, the topic missing
// from now on, so its rows wait aside and are parked after UnknownTopicTimeout, one a key, as
// a topic never seen; an unknown topic the broker has after all (librdkafka's metadata behind
// a topic just created, past its topic.metadata.propagation.max.ms) is tried again. A
// partition the topic does not have is the record's own refusal (parked).
func (r *Relay) refusal(p *producer, topic string, err error, alone bool, vanished map[string]topicAnswer) outcome {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return classify(err, alone)
	}
	switch ke.Code() {
	case kafka.ErrUnknownTopic, kafka.ErrUnknownTopicOrPart, kafka.ErrUnknownPartition:
		a, asked := vanished[topic]
		if !asked {
			a.gone, a.exists = r.topics.vanished(p, topic)
			vanished[topic] = a
		}
		switch {
		case a.gone:
			return outcomeNone
		case a.exists && ke.Code() != kafka.ErrUnknownPartition:
			return outcomeRetry
		}
	}
	return classify(err, alone)
}

// topicAnswer is the broker's answer about a topic whose record librdkafka refused as unknown.
type topicAnswer struct{ gone, exists bool }

// topicState is what a round found of a topic: missing (its rows wait aside) or refused
// for good (its rows are parked). Kept for the whole round, so that every row of a topic in
// the round gets the same answer: a topic missing when its first row was set aside and found
// past UnknownTopicTimeout at a later row would park a later row of a key while the earlier
// one stays pending, holding the earlier one behind it.
type topicState struct {
	wait bool
	park error
}

type topicStates map[string]topicState

// topicPartition names a partition of a topic, for counting what a production put in flight.
type topicPartition struct {
	topic     string
	partition int32
}

// produce sends rows (in order) and waits for their delivery reports, filling results.
// Rows whose (topic, key) is in blocked are not sent; a row refused before sending blocks
// its key for the rest of the round. topicStates holds the round's answers per topic.
//
// A broker refuses a whole batch, and a batch holds the records of one partition: a record
// refused as too large or invalid while it was the only record of its partition in flight
// is refused for its own sake (parked); otherwise it may be a neighbour's (outcomeIsolate).
func (r *Relay) produce(ctx context.Context, p *producer, rows []row, results []result, blocked map[keyID]bool, topicStates topicStates) {
	vanished := map[string]topicAnswer{} // the broker's answers at refusals, asked once a round a topic
	reports := make(chan kafka.Event, len(rows))
	inFlight := 0
	for i := range rows {
		w := &rows[i]
		if k, ok := w.keyID(); ok && blocked[k] {
			continue // waits behind its parked predecessor; stays pending
		}
		ts, seen := topicStates[w.topic]
		if !seen {
			ts.wait, ts.park = r.topics.check(p, w.topic, r.cfg.UnknownTopicTimeout)
			topicStates[w.topic] = ts
		}
		if ts.wait {
			continue // the topic does not exist (yet): set aside with its keys, other topics go on
		}
		if ts.park != nil {
			results[i] = result{outcome: outcomePark, err: ts.park}
			if k, ok := w.keyID(); ok {
				blocked[k] = true
			}
			continue
		}
		if err := (publish.Limits{Compacted: r.limits[w.topic].compacted}).RefusesNilKey(w.key); err != nil {
			// The broker would refuse it (INVALID_RECORD) and the whole batch with it.
			results[i] = result{outcome: outcomePark, err: err}
			continue
		}
		msg := r.message(w, i)
		for {
			err := p.p.Produce(msg, reports)
			if err == nil {
				inFlight++
				break
			}
			if ke, ok := err.(kafka.Error); ok && ke.Code() == kafka.ErrQueueFull {
				// librdkafka's queue (queue.buffering.max.messages/kbytes) is full: let it drain.
				p.p.Flush(100)
				continue
			}
			// Refused before sending (too large for message.max.bytes, unknown topic or
			// partition): the refusal is this record's own, unless its topic is gone.
			results[i] = result{outcome: r.refusal(p, w.topic, err, true, vanished), err: err}
			if k, ok := w.keyID(); ok {
				blocked[k] = true
			}
			break
		}
	}
	if inFlight == 1 {
		r.c.alone.Add(1)
	}
	// Refusals are classified once every report is in (or given up on): whether the record
	// was alone in its partition needs the partitions of all of them.
	type refusal struct {
		i   int
		err error
		tp  topicPartition
	}
	var refused []refusal
	sent := make(map[topicPartition]int, 4)
	defer func() {
		for _, f := range refused {
			results[f.i] = result{outcome: r.refusal(p, f.tp.topic, f.err, sent[f.tp] == 1, vanished), err: f.err}
		}
	}()
	// librdkafka reports every message within message.timeout.ms; after ctx is cancelled
	// wait at most ShutdownTimeout, then leave the rest pending (published again later).
	var giveUp <-chan time.Time
	done := ctx.Done()
	tick := time.NewTicker(r.keepaliveEvery()) // the leadership session is touched meanwhile
	defer tick.Stop()
	if inFlight > 0 {
		defer p.reach.Await()() // Ready: a broker that does not answer (frozen, cut off)
	}
	// Stopping, a broker that answers nothing for publish.CloseWait is not waited for the
	// rest of ShutdownTimeout: frozen or cut off, it would hold the stop for all of it.
	lastAnswer := time.Now()
	var quiet <-chan time.Time
	for inFlight > 0 {
		select {
		case <-tick.C:
			if err := r.keepalive(ctx); err != nil && ctx.Err() == nil {
				r.deposedWhileProducing(p, err)
			}
		case <-quiet:
			if time.Since(lastAnswer) >= publish.CloseWait {
				r.log.Warn("shutdown: Kafka has not answered for publish.CloseWait; rows whose delivery reports are missing stay pending and will be published again",
					zap.Int("rows", inFlight), zap.Duration("waited", time.Since(lastAnswer).Round(time.Millisecond)))
				return
			}
		case e := <-reports:
			m, ok := e.(*kafka.Message)
			if !ok {
				continue
			}
			inFlight--
			lastAnswer = time.Now()
			p.reach.Up()
			i := m.Opaque.(int)
			tp := topicPartition{rows[i].topic, m.TopicPartition.Partition}
			sent[tp]++
			if err := m.TopicPartition.Error; err != nil {
				refused = append(refused, refusal{i, err, tp})
				continue
			}
			results[i] = result{outcome: outcomeDelivered}
		case <-done:
			done = nil
			t := time.NewTimer(r.cfg.ShutdownTimeout)
			defer t.Stop()
			giveUp = t.C
			q := time.NewTicker(250 * time.Millisecond)
			defer q.Stop()
			quiet = q.C
		case <-giveUp:
			r.log.Warn("shutdown: delivery reports still missing; those rows stay pending and will be published again",
				zap.Int("rows", inFlight))
			return
		}
	}
}

// message builds the Kafka record of w: the row's headers in order, without any header
// named kafkatx-outbox-id, then the row's kafkatx-outbox-id.
func (r *Relay) message(w *row, i int) *kafka.Message {
	tp := kafka.TopicPartition{Topic: &w.topic, Partition: kafka.PartitionAny}
	if w.partition != nil {
		tp.Partition = *w.partition
	}
	hs := make([]kafka.Header, 0, len(w.hk)+1)
	for j := range w.hk {
		k := string(w.hk[j])
		if k == outbox.HeaderOutboxID {
			continue
		}
		hs = append(hs, kafka.Header{Key: k, Value: w.hv[j]})
	}
	hs = append(hs, kafka.Header{Key: outbox.HeaderOutboxID, Value: []byte(w.outboxID)})
	return &kafka.Message{TopicPartition: tp, Key: w.key, Value: w.value, Headers: hs, Opaque: i}
}

// checkOrder logs the one case where per-key order can break: a row refused asynchronously
// (parked after its delivery report) while a later row of the same key in the same batch was
// delivered. Synchronous refusals block their key before later rows are sent.
func (r *Relay) checkOrder(rows []row, results []result) {
	refused := map[keyID]int64{}
	for i := range rows {
		k, ok := rows[i].keyID()
		if !ok {
			continue
		}
		switch results[i].outcome {
		case outcomePark, outcomeRetry, outcomeIsolate:
			if _, seen := refused[k]; !seen {
				refused[k] = rows[i].id
			}
		case outcomeDelivered:
			if first, seen := refused[k]; seen {
				r.log.Error("per-key order broken: a later row of the key was delivered while an earlier one failed",
					zap.Int64("outbox_row", rows[i].id), zap.Int64("failed_row", first), zap.String("topic", k.topic))
			}
		}
	}
}

// fetch reads up to BatchSize pending rows in publication order ((commit_seq, id): commit
// order of their transactions, then write order), skipping rows whose
// (topic, key) has a parked row and rows of skipTopics (topics found missing).
//
// afterSeq, afterID > 0 read only rows after that one in publication order (marker).
func (r *Relay) fetch(ctx context.Context, skipTopics []string, afterSeq, afterID int64) ([]row, error) {
	// Transactions in commit order (outbox_commits), each one's pending rows in write order;
	// a streaming plan (index scan on commit_seq, nested loop on outbox_open_idx) that stops
	// at the limit. The inner ORDER BY/LIMIT matters: without it the incremental sort on
	// (commit_seq, id) reads every pending row of a transaction before it returns the first
	// (a 5,000-row consumer batch read whole for a 1,000-row round: 38 ms against 2.4 ms).
	// The read-after bound (marker) is a row comparison on outbox_open_idx's columns so that
	// it is an index condition there: written as o.id > $4 (or with OR) the planner scanned
	// the primary key instead, or the transaction's rows still waiting for their mark (50 ms
	// a round, against 2 ms).
	qctx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
	defer cancel()
	rows, err := r.pool.Query(qctx, r.fetchSQL(), r.cfg.BatchSize, skipTopics, afterSeq, afterID)
	if err != nil {
		return nil, r.readError(ctx, qctx, err)
	}
	var out []row
	var packs []packRead
	var anyParked bool
	for rows.Next() {
		var w row
		var pk packRead
		if err := rows.Scan(&w.commitSeq, &w.txid, &w.id, &w.outboxID, &w.topic, &w.key, &w.value, &w.hk, &w.hv, &w.partition, &w.createdAt,
			&pk.bytes, &pk.ids, &anyParked); err != nil {
			rows.Close()
			return nil, r.readError(ctx, qctx, err)
		}
		if pk.bytes != nil {
			pk.at, pk.row = len(out), w
			packs = append(packs, pk)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, r.readError(ctx, qctx, err)
	}
	if len(packs) > 0 {
		if out, err = r.unpack(qctx, out, packs, anyParked); err != nil {
			return nil, r.readError(ctx, qctx, err)
		}
	}
	return out, nil
}

// readError is fetch's error for err: one that names ReadTimeout when the read ran past it
// (qctx's deadline, not the caller's ctx).
func (r *Relay) readError(ctx, qctx context.Context, err error) error {
	r.recycle.After(r.pool, err) // a session opened under a short statement_timeout keeps it
	if ctx.Err() == nil && errors.Is(qctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("read pending outbox rows: no answer within ReadTimeout (%v); cancelled, read again after the backoff: %w", r.cfg.ReadTimeout, err)
	}
	return fmt.Errorf("read pending outbox rows: %w", err)
}

// fetchSQL is fetch's statement: $1 the most rows, $2 the topics to skip, $3 and $4 the row
// to read after (0, 0: from the head).
func (r *Relay) fetchSQL() string {
	// A packed row (state 'packed', migration 015) holds pack_count records: the rows are cut
	// where the records read reach $1 (the window's running count), so a round of packs reads
	// about $1 records, not $1 packs. A pack's key is NULL, so it passes notBehindParked;
	// unpack checks its records' keys.
	// any_parked (one probe of outbox_parked_idx a read) tells unpack whether a pack's keys
	// need checking at all.
	return `WITH parked AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM ` + r.t.Outbox + ` p0 WHERE p0.state = 'parked') AS any)
		SELECT x.commit_seq, x.txid, x.id, x.outbox_id, x.topic, x.key, x.value, x.header_keys, x.header_values, x.partition, x.created_at,
		       x.pack, x.pack_ids, (SELECT parked.any FROM parked) AS any_parked
		FROM (
		SELECT c.commit_seq, o.txid, o.id, o.outbox_id::text, o.topic, o.key, o.value, o.header_keys, o.header_values, o.partition, o.created_at,
		       CASE WHEN o.state = 'packed' THEN o.pack END AS pack, o.pack_ids, o.pack_count,
		       sum(o.pack_count) OVER (ORDER BY c.commit_seq, o.id) AS upto
		FROM ` + r.commits + ` c
		CROSS JOIN LATERAL (
			SELECT * FROM ` + r.t.Outbox + ` o
			 WHERE o.txid = c.txid AND o.state IN ('pending', 'packed') AND (o.state = 'packed' OR o.topic <> ALL($2::text[]))
			   AND (o.txid, o.id) > (c.txid, CASE WHEN c.commit_seq = $3 THEN $4 ELSE 0 END)
			   AND ` + r.notBehindParkedIf(`NOT (SELECT parked.any FROM parked)`) + `
			 ORDER BY o.id
			 LIMIT $1
		) o
		WHERE c.commit_seq >= $3
		ORDER BY c.commit_seq, o.id
		LIMIT $1) x
		WHERE x.upto - x.pack_count < $1
		ORDER BY x.commit_seq, x.id`
}

// mark records the round's outcomes in one round trip: delivered rows deleted (or marked
// published, with KeepPublished), refused rows parked with their error, retriable failures
// counted, and the bookkeeping rows of finished transactions deleted. It retries a failed write a few
// times (a row delivered but left unmarked is published again, with the same id).
func (r *Relay) mark(ctx context.Context, rows []row, results []result) error {
	var pubIDs, parkIDs, retryIDs []int64
	var parkErrs, retryErrs []string
	var firstRetry *row // the first row to retry, logged for all of them (one line a mark)
	var firstErr error
	now := time.Now()
	pm := packMarks(rows, results) // the records of packed rows are marked by their pack (packs.go)
	for i, res := range results {
		w := &rows[i]
		switch res.outcome {
		case outcomeDelivered:
			if w.pack == 0 {
				pubIDs = append(pubIDs, w.id)
			}
		case outcomePark:
			if w.pack == 0 {
				parkIDs = append(parkIDs, w.id)
				parkErrs = append(parkErrs, pg.SanitizeText(res.err.Error(), 1024))
			}
			r.log.Error("outbox row parked: the broker refused it for good; later rows of its key wait behind it",
				zap.Int64("outbox_row", w.id), zap.String("outbox_id", w.outboxID), zap.String("topic", w.topic), zap.Error(res.err))
		case outcomeRetry, outcomeIsolate:
			if w.pack == 0 {
				retryIDs = append(retryIDs, w.id)
				retryErrs = append(retryErrs, pg.SanitizeText(res.err.Error(), 1024))
			}
			if firstRetry == nil {
				firstRetry, firstErr = w, res.err
			}
		}
	}
	if firstRetry != nil {
		// One line a mark, not one a row: a round of rows produced one at a time after a
		// batch-level refusal logged tens of thousands of lines. Each row's error is stored
		// in its last_error and reported to HookPublishRetried.
		r.log.Warn("outbox rows not published; will retry", zap.Int("rows", len(retryIDs)), zap.Int("packed_rows", len(pm.packIDs)),
			zap.Int64("first_outbox_row", firstRetry.id), zap.String("first_outbox_id", firstRetry.outboxID),
			zap.String("topic", firstRetry.topic), zap.Error(firstErr))
	}
	if len(pubIDs)+len(parkIDs)+len(retryIDs)+len(pm.packIDs) == 0 {
		return nil
	}
	// Delivered rows are deleted by range (deleteRanges), or by id once a range held a row
	// that was not delivered (byID).
	byID := false
	var delivered map[int64]bool // the check of deleteRanges; KeepPublished updates by id
	if r.cfg.KeepPublished == 0 {
		delivered = make(map[int64]bool, len(pubIDs))
		for _, id := range pubIDs {
			delivered[id] = true
		}
	}
	// A new batch per try: pgx keeps statement descriptions in a sent batch's queued queries,
	// and a batch sent again after an error used them stale ("prepared statement ... does not
	// exist", SQLSTATE 26000, on every retry).
	newBatch := func() *pgx.Batch {
		b := &pgx.Batch{}
		// The mark need not be durable: lost in a database crash, it leaves its rows pending and
		// they are published again with the same kafkatx-outbox-id, as after a relay crash between
		// produce and mark. So the round does not wait for the WAL flush (one fsync per round).
		b.Queue(`SET LOCAL synchronous_commit = off`)
		if r.cfg.LeaderTimeout > 0 {
			// A leader frozen inside its mark (between the batch and COMMIT) holds the rows'
			// locks; the next leader's mark of the same rows would wait for them as long as it
			// stays frozen. PostgreSQL ends such a transaction after LeaderTimeout.
			b.Queue(fmt.Sprintf(`SET LOCAL idle_in_transaction_session_timeout = %d`, r.cfg.LeaderTimeout.Milliseconds()))
		}
		if len(pubIDs) > 0 && r.cfg.KeepPublished == 0 && !byID {
			r.deleteRanges(b, pm.plainRows, pm.plainResults, delivered)
		} else if len(pubIDs) > 0 && r.cfg.KeepPublished == 0 {
			b.Queue(`DELETE FROM `+r.t.Outbox+` WHERE id = ANY($1) AND state = 'pending'`, pubIDs)
		} else if len(pubIDs) > 0 {
			b.Queue(`UPDATE `+r.t.Outbox+` SET state = 'published', resolved_at = now(), attempts = attempts + 1, last_error = NULL
			WHERE id = ANY($1) AND state = 'pending'`, pubIDs)
		}
		if len(parkIDs) > 0 {
			b.Queue(`UPDATE `+r.t.Outbox+` o SET state = 'parked', parked_at = now(), attempts = o.attempts + 1, last_error = f.err
			FROM unnest($1::bigint[], $2::text[]) AS f(id, err) WHERE o.id = f.id AND o.state = 'pending'`, parkIDs, parkErrs)
		}
		if len(retryIDs) > 0 {
			b.Queue(`UPDATE `+r.t.Outbox+` o SET attempts = o.attempts + 1, last_error = f.err
			FROM unnest($1::bigint[], $2::text[]) AS f(id, err) WHERE o.id = f.id AND o.state = 'pending'`, retryIDs, retryErrs)
		}
		pm.queue(b, r.t.Outbox, r.commits, r.cfg.KeepPublished != 0)
		if len(pubIDs) > 0 || len(pm.packIDs) > 0 {
			// The bookkeeping row of a transaction goes once none of its rows is open.
			seqs := make([]int64, 0, 8)
			seen := map[int64]bool{}
			for _, w := range rows {
				if !seen[w.commitSeq] {
					seen[w.commitSeq] = true
					seqs = append(seqs, w.commitSeq)
				}
			}
			b.Queue(`DELETE FROM `+r.commits+` c WHERE c.commit_seq = ANY($1)
			AND NOT EXISTS (SELECT 1 FROM `+r.t.Outbox+` o WHERE o.txid = c.txid AND o.state IN ('pending', 'parked', 'packed'))`, seqs)
		}
		return b
	}
	// Delivered rows must be marked even while shutting down.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	defer cancel()
	var err error
	var skipped map[int]bool // rows markByRow left pending
	for try := 1; try <= 5; try++ {
		if err = pgx.BeginFunc(mctx, r.pool, func(tx pgx.Tx) error {
			if err := tx.SendBatch(mctx, newBatch()).Close(); err != nil {
				return err
			}
			if r.signals.inMark != nil {
				r.signals.inMark()
			}
			return nil
		}); err == nil {
			break
		}
		if rowRefusal(err) {
			// PostgreSQL refused a statement of the mark for what one row holds (a value too
			// large for an index entry, a check): the same batch fails on every try, and with
			// it the marks of every other row. Mark each row on its own instead: a row whose
			// statement is refused stays pending (Ready names it) and the others are marked.
			r.log.Warn("relay: the mark was refused; marking its rows one at a time", zap.Error(err))
			if skipped, err = r.markByRow(mctx, rows, results); err == nil {
				break
			}
		}
		if errors.Is(err, errRangeWider) && !byID {
			// Rolled back: mark again at once, deleting the delivered rows by id.
			byID = true
			r.log.Debug("relay: a delivered range held rows that were not delivered; deleting the delivered rows by id", zap.Error(err))
			try--
			continue
		}
		if readOnlyServer(err) {
			r.pool.Reset() // the retry connects afresh: the rows were delivered, mark them on a writable server
		}
		if !sleep(mctx, time.Duration(try)*200*time.Millisecond) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("mark %d published, %d parked outbox rows: %w", len(pubIDs), len(parkIDs), err)
	}
	// Counted once marked: a mark that failed is tried again with the next round's (marker).
	// After a mark row by row, a row it could not mark has outcomeNone (a copy: the round
	// reads results meanwhile).
	if len(skipped) > 0 {
		results = append([]result(nil), results...)
		for i := range skipped {
			results[i] = result{outcome: outcomeNone}
		}
	}
	var published, parked, retried int64
	for _, res := range results {
		switch res.outcome {
		case outcomeDelivered:
			published++
		case outcomePark:
			parked++
		case outcomeRetry, outcomeIsolate:
			retried++
		}
	}
	r.c.published.Add(published)
	r.c.parked.Add(parked)
	r.c.retried.Add(retried)
	r.marked(rows, results, now)
	r.unmarkable.forget(rows, results)
	return nil
}

// rowRefusal reports whether err is PostgreSQL refusing a statement for the values it
// writes, which one row's can cause: SQLSTATE class 22 (data exception), 23 (integrity
// constraint violation) or 54 (program limit exceeded: an index entry too large, 54000).
// Trying again fails the same way.
func rowRefusal(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// markByRow records the round's outcomes as mark does, in one transaction, but each row's
// statement under its own savepoint: a row whose statement PostgreSQL refuses for its values
// (rowRefusal) is left as it was — pending — and every other row is marked. A refused row is logged and
// named by Ready (unmarkable) until a later mark marks it; skipped holds the indexes of such
// rows. A delivered row left pending is published again (with the same kafkatx-outbox-id); a
// refused park or retry is produced again by a later round. It returns an error, and marks
// nothing, when the transaction or a statement fails otherwise (the mark is then retried,
// then carried, as a failed mark is).
func (r *Relay) markByRow(ctx context.Context, rows []row, results []result) (skipped map[int]bool, err error) {
	type refusal struct {
		i   int
		err error
	}
	var refused []refusal
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		refused = refused[:0]
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		if r.cfg.LeaderTimeout > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL idle_in_transaction_session_timeout = %d`, r.cfg.LeaderTimeout.Milliseconds())); err != nil {
				return err
			}
		}
		var seqs []int64
		seen := map[int64]bool{}
		if pm := packMarks(rows, results); len(pm.packIDs) > 0 {
			// The packs in one statement, under their own savepoint: refused, they stay as
			// they are (published again, with the same ids) and the plain rows are marked.
			b := &pgx.Batch{}
			pm.queue(b, r.t.Outbox, r.commits, r.cfg.KeepPublished != 0)
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := sp.SendBatch(ctx, b).Close(); err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil || !rowRefusal(err) {
					return err
				}
				for i := range rows {
					if rows[i].pack != 0 && results[i].outcome != outcomeNone {
						refused = append(refused, refusal{i, err})
					}
				}
			} else if err := sp.Commit(ctx); err != nil {
				return err
			}
			for _, w := range rows {
				if w.pack != 0 && !seen[w.commitSeq] {
					seen[w.commitSeq] = true
					seqs = append(seqs, w.commitSeq)
				}
			}
		}
		for i, res := range results {
			w := &rows[i]
			if w.pack != 0 {
				continue // marked with its pack, above
			}
			var sql string
			args := []any{w.id}
			switch res.outcome {
			case outcomeDelivered:
				if r.cfg.KeepPublished == 0 {
					sql = `DELETE FROM ` + r.t.Outbox + ` WHERE id = $1 AND state = 'pending'`
				} else {
					sql = `UPDATE ` + r.t.Outbox + ` SET state = 'published', resolved_at = now(), attempts = attempts + 1, last_error = NULL
					WHERE id = $1 AND state = 'pending'`
				}
				if !seen[w.commitSeq] {
					seen[w.commitSeq] = true
					seqs = append(seqs, w.commitSeq)
				}
			case outcomePark:
				sql = `UPDATE ` + r.t.Outbox + ` SET state = 'parked', parked_at = now(), attempts = attempts + 1, last_error = $2
				WHERE id = $1 AND state = 'pending'`
				args = append(args, pg.SanitizeText(res.err.Error(), 1024))
			case outcomeRetry, outcomeIsolate:
				sql = `UPDATE ` + r.t.Outbox + ` SET attempts = attempts + 1, last_error = $2 WHERE id = $1 AND state = 'pending'`
				args = append(args, pg.SanitizeText(res.err.Error(), 1024))
			default:
				continue
			}
			sp, err := tx.Begin(ctx) // SAVEPOINT
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, sql, args...); err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil || !rowRefusal(err) {
					return err
				}
				refused = append(refused, refusal{i, err})
				continue
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
		}
		if len(seqs) > 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM `+r.commits+` c WHERE c.commit_seq = ANY($1)
			AND NOT EXISTS (SELECT 1 FROM `+r.t.Outbox+` o WHERE o.txid = c.txid AND o.state IN ('pending', 'parked', 'packed'))`, seqs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	skipped = make(map[int]bool, len(refused))
	for _, f := range refused {
		w := &rows[f.i]
		what := map[outcome]string{outcomeDelivered: "marked published (it was delivered and will be published again)",
			outcomePark: "parked", outcomeRetry: "counted as retried", outcomeIsolate: "counted as retried"}[results[f.i].outcome]
		r.log.Error("outbox row could not be "+what+": PostgreSQL refused its statement; it stays pending, the other rows are marked",
			zap.Int64("outbox_row", w.id), zap.String("outbox_id", w.outboxID), zap.String("topic", w.topic), zap.Error(f.err))
		r.unmarkable.add(w, what, f.err)
		skipped[f.i] = true
	}
	return skipped, nil
}
