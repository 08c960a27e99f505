package relay

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// The janitor runs inside the relay, on the leader only, so one process per database does
// the deleting. See JanitorConfig.

// runJanitor runs a janitor pass every Janitor.Interval until ctx is done.
func (r *Relay) runJanitor(ctx context.Context) {
	t := time.NewTicker(r.cfg.Janitor.Interval)
	defer t.Stop()
	for {
		if err := r.Clean(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("janitor pass failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Clean runs one retention pass now: it deletes, Janitor.BatchSize rows per statement,
// published and discarded outbox rows older than OutboxRetention, attempt rows untouched for
// AttemptsRetention, and dead letters resolved (replayed or discarded) more than
// DeadLetterRetention ago. It is what the leader's janitor runs every Janitor.Interval.
func (r *Relay) Clean(ctx context.Context) error {
	j := r.cfg.Janitor
	jobs := []struct {
		table string
		keep  time.Duration
		sql   string
	}{
		{"outbox", j.OutboxRetention, `DELETE FROM ` + r.t.Outbox + ` WHERE id IN (SELECT id FROM ` + r.t.Outbox + `
			WHERE state IN ('published', 'discarded') AND resolved_at < now() - make_interval(secs => $1) ORDER BY resolved_at LIMIT $2)`},
		{"attempts", j.AttemptsRetention, `DELETE FROM ` + r.t.Attempts + ` WHERE ctid IN (SELECT ctid FROM ` + r.t.Attempts + `
			WHERE updated_at < now() - make_interval(secs => $1) LIMIT $2)`},
		{"dead_letters", j.DeadLetterRetention, `DELETE FROM ` + r.t.DeadLetters + ` WHERE id IN (SELECT id FROM ` + r.t.DeadLetters + `
			WHERE status IN ('replayed', 'discarded') AND resolved_at < now() - make_interval(secs => $1) LIMIT $2)`},
	}
	for _, job := range jobs {
		if job.keep < 0 {
			continue
		}
		total := int64(0)
		for {
			tag, err := r.pool.Exec(ctx, job.sql, job.keep.Seconds(), j.BatchSize)
			if err != nil {
				return fmt.Errorf("janitor: delete old %s rows: %w", job.table, err)
			}
			n := tag.RowsAffected()
			total += n
			r.m.deleted.WithLabelValues(job.table).Add(float64(n))
			if n < int64(j.BatchSize) {
				break
			}
			if !sleep(ctx, 10*time.Millisecond) { // small batches, with room for other work between them
				return nil
			}
		}
		if total > 0 {
			r.log.Info("janitor deleted old rows", zap.String("table", job.table), zap.Int64("rows", total))
		}
	}
	return nil
}
