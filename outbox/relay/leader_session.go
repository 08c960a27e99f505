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
)

// The leadership lock is held by the leader's session, and a frozen leader process (SIGSTOP,
// a VM paused, a process stuck) keeps that session open: its kernel still answers TCP
// keepalives, so PostgreSQL never ends it and no standby ever takes the lock — nothing is
// published until the leader comes back (found by a fresh-eyes attack: 60,000 events held 74
// s with the standby's /readyz 200). So the leader asks PostgreSQL to end its session once it
// stays silent for Config.LeaderTimeout (idle_session_timeout on that session alone,
// PostgreSQL 14+), and a running leader touches its session at least every LeaderTimeout/4
// — around each round, in its backoff, and while it waits for delivery reports — so it is
// never deposed while it runs. A standby then takes the lock within StandbyInterval.

// leaderSession is the lead goroutine's use of the leadership session: conn and when it last
// answered. Used by that goroutine only.
type leaderSession struct {
	conn *pgx.Conn
	at   time.Time
}

// armLeaderTimeout sets idle_session_timeout on the leadership session (LeaderTimeout; off
// when negative). A server without the setting (before PostgreSQL 14) is logged, and the
// relay leads without it.
func (r *Relay) armLeaderTimeout(ctx context.Context, conn *pgx.Conn) error {
	if r.cfg.LeaderTimeout <= 0 {
		return nil
	}
	_, err := conn.Exec(ctx, fmt.Sprintf("SET idle_session_timeout = %d", r.cfg.LeaderTimeout.Milliseconds()))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42704" { // undefined_object: no such setting
		r.log.Warn("the server has no idle_session_timeout (PostgreSQL 14+): a frozen leader keeps the leadership until it ends",
			zap.Duration("leader_timeout", r.cfg.LeaderTimeout))
		return nil
	}
	if err != nil {
		return fmt.Errorf("leadership session: set idle_session_timeout: %w", err)
	}
	return nil
}

// fence checks the leadership session (requireWritable) and records that it answered.
func (s *leaderSession) fence(ctx context.Context) error {
	err := requireWritable(ctx, s.conn)
	if err == nil {
		s.at = time.Now()
	}
	return err
}

// keepalive fences when the session has been silent for a quarter of the leader timeout; a
// session that no longer answers is the deposition, returned as the fence's error.
func (r *Relay) keepalive(ctx context.Context) error {
	s := r.leading
	if s == nil || r.cfg.LeaderTimeout <= 0 || time.Since(s.at) < r.cfg.LeaderTimeout/4 {
		return nil
	}
	return s.fence(ctx)
}

// keepaliveEvery is how often a wait of the leader touches its session.
func (r *Relay) keepaliveEvery() time.Duration {
	if r.cfg.LeaderTimeout <= 0 {
		return time.Hour
	}
	return max(r.cfg.LeaderTimeout/4, 10*time.Millisecond)
}

// sleepLeading is sleep for the leader: it touches the session while it waits and returns
// false when ctx ended or the session no longer answers (the caller's next fence reports it).
func (r *Relay) sleepLeading(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return ctx.Err() == nil
		}
		if !sleep(ctx, min(left, r.keepaliveEvery())) {
			return false
		}
		if err := r.keepalive(ctx); err != nil {
			return ctx.Err() == nil
		}
	}
}

// deposedWhileProducing drops what librdkafka has not sent yet once the leadership session no
// longer answers during a wait for delivery reports: those rows stay pending for the new
// leader, rather than being published after its records by a leader that came back (records
// already sent cannot be called back: a resumed leader publishes them again, same outbox ids).
func (r *Relay) deposedWhileProducing(p *producer, err error) {
	r.log.Warn("the leadership session stopped answering while records were being produced; dropping those not sent yet", zap.Error(err))
	_ = p.p.Purge(kafka.PurgeQueue | kafka.PurgeNonBlocking)
}
