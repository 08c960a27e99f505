package engine

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// The breaker stops a storm of dead letters that no list of error codes can foresee: a
// privilege revoked from the service, a column a deploy renamed, a dependency that answers
// 500 to everyone. Such a failure is shared — every message meets it — while a poison pill is
// one message's. So the breaker counts distinct messages (topic, partition, offset) that
// failed alike (the same signature: a PostgreSQL error's SQLSTATE, otherwise the error's text
// with its digits blanked) with no successful transaction in between, across every partition
// of the consumer. At Settings.BreakerThreshold such messages (kafkatx's default 3), two of
// them in one partition (it moved past a failed message and the next failed alike: pills
// that several partitions meet at once do not), it opens:
// a try that fails alike is then held instead of counted — rolled back, no attempt recorded,
// no dead letter — and its partition waits Settings.BreakerProbe outside any transaction and
// tries again (the probe). The first transaction that commits handled messages closes it.
// It is logged once when it opens and once when it closes, and named by readiness and
// metrics while open. Bounded as Unavailable's wait is: once open for
// Settings.UnavailableMaxWait it holds no more, and tries count as attempts again until a
// success closes it. One bad message among good ones never opens it: the good ones' commits
// reset the count.

// Breaker is the loop's breaker, shared by its workers. Safe for concurrent use.
type Breaker struct {
	threshold int           // ≤ 0: never opens
	probe     time.Duration // a held partition's wait before its next try
	maxOpen   time.Duration // holds no more after this long open
	log       *zap.Logger
	emit      func(open bool, s BreakerState)

	mu      sync.Mutex
	counts  map[string]map[Position]bool // signature → distinct failing messages since the last success
	open    *BreakerState
	expired bool
}

// BreakerState is an open breaker: since when, the failure's signature and an example of it,
// how many distinct messages failed alike when it opened, and the partitions it holds now.
type BreakerState struct {
	Since     time.Time
	Signature string // "SQLSTATE 42501" or the error text with digits blanked, at most 200 bytes
	SQLState  string // the failure's SQLSTATE when PostgreSQL answered
	Example   string // one failure's text, sanitized, at most 512 bytes
	Messages  int
	Held      []offsetstore.TP
	// Dependency: the failures are a dependency's Unavailable answers, counted alike so that
	// parking tells a far side down for everyone from one key's trouble (park.go); the
	// consumer stays ready meanwhile, as for any partition waiting on a dependency.
	Dependency bool
}

func newBreaker(threshold int, probe, maxOpen time.Duration, log *zap.Logger, emit func(bool, BreakerState)) *Breaker {
	return &Breaker{threshold: threshold, probe: probe, maxOpen: maxOpen, log: log, emit: emit,
		counts: map[string]map[Position]bool{}}
}

// signature is what makes two failures alike: the SQLSTATE of a PostgreSQL error, otherwise
// the error's text with every run of digits replaced by "#", at most 200 bytes.
func signature(err error) (sig, sqlstate string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgerr.Describe(err)
		return "SQLSTATE " + strings.TrimSpace(c.String()), pgErr.Code
	}
	var b strings.Builder
	digits := false
	for _, r := range err.Error() {
		if unicode.IsDigit(r) {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
		if b.Len() >= 200 {
			break
		}
	}
	return pg.SanitizeText(b.String(), 200), ""
}

// failed records that the message at pos failed with err and reports whether the try is
// held (the breaker is open for this failure's signature, within its bound): the caller
// rolls back, records no attempt, waits the probe and tries again. count false only asks:
// a failure inside a batch behind messages not yet committed, or one not naming its
// message, is not counted (the messages before it may well succeed).
func (b *Breaker) failed(pos Position, err error, count bool) bool {
	if b == nil || b.threshold <= 0 {
		return false
	}
	sig, state := signature(err)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open != nil {
		if b.open.Signature != sig || b.expired {
			return false
		}
		if time.Since(b.open.Since) >= b.maxOpen {
			b.expired = true
			b.log.Warn("breaker open past its bound; tries of the failing messages count as attempts again",
				zap.String("signature", sig), zap.Duration("bound", b.maxOpen))
			return false
		}
		if !containsTP(b.open.Held, pos.TP) {
			b.open.Held = append(b.open.Held, pos.TP)
		}
		return true
	}
	if !count {
		return false
	}
	ms := b.counts[sig]
	if ms == nil {
		ms = map[Position]bool{}
		b.counts[sig] = ms
	}
	ms[pos] = true
	if len(ms) < b.threshold || !movedOn(ms) {
		return false
	}
	b.open = &BreakerState{Since: time.Now(), Signature: sig, SQLState: state, Example: pg.SanitizeText(err.Error(), 512),
		Messages: len(ms), Held: []offsetstore.TP{pos.TP}, Dependency: err == errUnavailableAlike}
	b.log.Error("breaker open: messages of several partitions fail alike; the failing partitions pause and probe, spending no attempts and dead-lettering nothing until a transaction succeeds",
		zap.String("signature", sig), zap.Int("messages", len(ms)), zap.String("example", b.open.Example),
		zap.Duration("probe", b.probe), zap.Duration("bound", b.maxOpen))
	if b.emit != nil {
		b.emit(true, *b.open)
	}
	return true
}

// succeeded records a transaction that committed handled messages: the spell of failures
// ends, and an open breaker closes.
func (b *Breaker) succeeded() {
	if b == nil || b.threshold <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.counts) > 0 {
		clear(b.counts)
	}
	if b.open != nil {
		s := *b.open
		b.open, b.expired = nil, false
		b.log.Warn("breaker closed: a transaction succeeded; the partitions go on", zap.String("signature", s.Signature),
			zap.Duration("open_for", time.Since(s.Since)))
		if b.emit != nil {
			b.emit(false, s)
		}
	}
}

// State returns the open breaker, or nil.
func (b *Breaker) State() *BreakerState {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open == nil {
		return nil
	}
	s := *b.open
	s.Held = append([]offsetstore.TP(nil), s.Held...)
	return &s
}

// movedOn reports whether some partition has two distinct failing messages in ms: it moved
// past a message that failed (dead-lettered it) and the next failed alike, with no success
// between. Poison pills met at once by several partitions never show this — after a pill's
// dead letter its partition's next message succeeds — while a shared failure always does.
func movedOn(ms map[Position]bool) bool {
	seen := map[offsetstore.TP]bool{}
	for pos := range ms {
		if seen[pos.TP] {
			return true
		}
		seen[pos.TP] = true
	}
	return false
}

func containsTP(tps []offsetstore.TP, tp offsetstore.TP) bool {
	for _, t := range tps {
		if t == tp {
			return true
		}
	}
	return false
}

// errHeld is the loop's error for a try the breaker holds: untilDone waits the probe and runs
// the transaction again; no attempt is recorded.
type errHeld struct{ cause error }

func (e *errHeld) Error() string {
	return fmt.Sprintf("held by the open breaker: %v", e.cause)
}
func (e *errHeld) Unwrap() error { return e.cause }
