package relay

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/pg"
)

// Hook is a value given in Config.Hooks. It implements one or more of the Hook* interfaces
// below, each with one method for one event of the relay, in the manner of franz-go's hooks:
// a hook implements only the events it wants, and a new event is a new interface, so adding
// one never breaks a hook. The relay's Prometheus metrics are such a hook (metrics.go). New
// refuses a Hook that implements none of them.
//
// Hooks are called synchronously from the relay's goroutines, after the event happened: they
// must be safe for concurrent use, return quickly and not block. A panic in a hook is
// recovered and logged at error level; it changes nothing in the relay. Events carry no
// record keys or values.
type Hook any

// HookPublished is called for each outbox row the broker acknowledged, once the row is marked
// (deleted, or kept as published) in the database.
type HookPublished interface {
	OnPublished(Published)
}

// Published describes a published outbox row. Latency is the time from the row's insert
// (created_at, the database's clock) to the broker's acknowledgement.
type Published struct {
	Schema   string
	Topic    string
	RowID    int64  // the outbox table's id column
	OutboxID string // the kafkatx-outbox-id header
	Latency  time.Duration
}

// HookParked is called for each outbox row parked because the broker refused it for good,
// once the row is marked parked.
type HookParked interface {
	OnParked(Parked)
}

// Parked describes a parked outbox row and the broker's refusal.
type Parked struct {
	Schema   string
	Topic    string
	RowID    int64
	OutboxID string
	Error    string
}

// HookPublishRetried is called for each delivery that failed with a retriable error (the row
// stays pending and is produced again).
type HookPublishRetried interface {
	OnPublishRetried(PublishRetried)
}

// PublishRetried describes a failed delivery that will be tried again.
type PublishRetried struct {
	Schema   string
	Topic    string
	RowID    int64
	OutboxID string
	Error    string
}

// HookBacklogMeasured is called every Config.MetricsInterval (at most) while the relay runs,
// whether it leads or stands by.
type HookBacklogMeasured interface {
	OnBacklogMeasured(BacklogMeasured)
}

// BacklogMeasured is the outbox's state: Rows waiting to be published (parked rows and rows
// waiting behind them excluded), the age of the oldest (0 when none), and Parked rows.
type BacklogMeasured struct {
	Schema    string
	Rows      int64
	OldestAge time.Duration
	Parked    int64
}

// HookLeadership is called when the relay takes or gives up the outbox's leadership lock.
type HookLeadership interface {
	OnLeadership(Leadership)
}

// Leadership reports whether the relay now leads (and publishes) the outbox of Schema.
type Leadership struct {
	Schema string
	Leader bool
}

// HookJanitorDeleted is called after each batch of rows the retention janitor deleted.
type HookJanitorDeleted interface {
	OnJanitorDeleted(JanitorDeleted)
}

// JanitorDeleted counts rows deleted from Table by the janitor.
type JanitorDeleted struct {
	Schema string
	Table  string
	Rows   int64
}

// HookRound is called after each round that produced rows, before its outcomes are marked:
// how the leader's time went, step by step. A leader that keeps up spends most of it in
// Produce; Read or MarkWait growing says the database is the wall.
type HookRound interface {
	OnRound(Round)
}

// Round is one publishing round. Read is the time waiting for the round's rows: the read
// itself, or only the rest of the read started during the previous round (ReadAhead true).
// Produce is the time from the first record handed to the producer to the last delivery
// report. MarkWait is the time waiting for the previous round's mark to finish (before a
// read from the head of the outbox, and before this round's own mark starts).
type Round struct {
	Schema    string
	Rows      int
	Read      time.Duration
	ReadAhead bool
	Produce   time.Duration
	MarkWait  time.Duration
}

// hookSet is Config.Hooks sorted by interface once.
type hookSet struct {
	published []HookPublished
	parked    []HookParked
	retried   []HookPublishRetried
	backlog   []HookBacklogMeasured
	leader    []HookLeadership
	deleted   []HookJanitorDeleted
	round     []HookRound
}

// newHookSet sorts own (the relay's) then user hooks; a user hook that implements none of
// the Hook* interfaces is an error (most likely a misspelt method).
func newHookSet(own []Hook, user []Hook) (hookSet, error) {
	var s hookSet
	for i, h := range append(own[:len(own):len(own)], user...) {
		n := 0
		if v, ok := h.(HookPublished); ok {
			s.published = append(s.published, v)
			n++
		}
		if v, ok := h.(HookParked); ok {
			s.parked = append(s.parked, v)
			n++
		}
		if v, ok := h.(HookPublishRetried); ok {
			s.retried = append(s.retried, v)
			n++
		}
		if v, ok := h.(HookBacklogMeasured); ok {
			s.backlog = append(s.backlog, v)
			n++
		}
		if v, ok := h.(HookLeadership); ok {
			s.leader = append(s.leader, v)
			n++
		}
		if v, ok := h.(HookJanitorDeleted); ok {
			s.deleted = append(s.deleted, v)
			n++
		}
		if v, ok := h.(HookRound); ok {
			s.round = append(s.round, v)
			n++
		}
		if n == 0 {
			return hookSet{}, fmt.Errorf("relay: Config.Hooks[%d] (%T) implements none of the Hook* interfaces", i-len(own), h)
		}
	}
	return s, nil
}

// The relay's events: each moves its Stats counter (where it has one) and calls the hooks
// that want it, the Prometheus hook first.

// recoverHook logs a hook's panic instead of letting it reach the relay.
func (r *Relay) recoverHook(h any) {
	if v := recover(); v != nil {
		r.log.Error("hook panicked; ignored, the relay goes on", zap.String("hook", fmt.Sprintf("%T", h)), zap.String("panic", fmt.Sprint(v)))
	}
}

func (r *Relay) published(w *row, now time.Time) {
	ev := Published{Schema: r.cfg.Schema, Topic: w.topic, RowID: w.id, OutboxID: w.outboxID, Latency: now.Sub(w.createdAt)}
	for _, h := range r.hooks.published {
		func() { defer r.recoverHook(h); h.OnPublished(ev) }()
	}
}

func (r *Relay) parkedRow(w *row, msg string) {
	ev := Parked{Schema: r.cfg.Schema, Topic: w.topic, RowID: w.id, OutboxID: w.outboxID, Error: msg}
	for _, h := range r.hooks.parked {
		func() { defer r.recoverHook(h); h.OnParked(ev) }()
	}
}

func (r *Relay) retriedRow(w *row, msg string) {
	ev := PublishRetried{Schema: r.cfg.Schema, Topic: w.topic, RowID: w.id, OutboxID: w.outboxID, Error: msg}
	for _, h := range r.hooks.retried {
		func() { defer r.recoverHook(h); h.OnPublishRetried(ev) }()
	}
}

func (r *Relay) backlogMeasured(rows int64, age time.Duration, parked int64) {
	ev := BacklogMeasured{Schema: r.cfg.Schema, Rows: rows, OldestAge: age, Parked: parked}
	for _, h := range r.hooks.backlog {
		func() { defer r.recoverHook(h); h.OnBacklogMeasured(ev) }()
	}
}

func (r *Relay) leadership(leader bool) {
	r.c.leader.Store(leader)
	ev := Leadership{Schema: r.cfg.Schema, Leader: leader}
	for _, h := range r.hooks.leader {
		func() { defer r.recoverHook(h); h.OnLeadership(ev) }()
	}
}

func (r *Relay) janitorDeleted(table string, n int64) {
	ev := JanitorDeleted{Schema: r.cfg.Schema, Table: table, Rows: n}
	for _, h := range r.hooks.deleted {
		func() { defer r.recoverHook(h); h.OnJanitorDeleted(ev) }()
	}
}

func (r *Relay) roundDone(ev Round) {
	ev.Schema = r.cfg.Schema
	for _, h := range r.hooks.round {
		func() { defer r.recoverHook(h); h.OnRound(ev) }()
	}
}

// marked reports the outcomes of a round once mark recorded them: results[i] is rows[i]'s.
func (r *Relay) marked(rows []row, results []result, now time.Time) {
	for i, res := range results {
		w := &rows[i]
		switch res.outcome {
		case outcomeDelivered:
			r.published(w, now)
		case outcomePark:
			if len(r.hooks.parked) > 0 {
				r.parkedRow(w, pg.SanitizeText(res.err.Error(), 1024))
			}
		case outcomeRetry, outcomeIsolate:
			if len(r.hooks.retried) > 0 {
				r.retriedRow(w, pg.SanitizeText(res.err.Error(), 1024))
			}
		}
	}
}
