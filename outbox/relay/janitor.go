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
// published rows kept longer than KeepPublished and discarded rows resolved longer ago than
// that, attempt rows untouched for AttemptsRetention, dead letters resolved (replayed or
// discarded) more than DeadLetterRetention ago, and outbox_commits rows of transactions with
// no open row left. It adopts outbox rows whose transaction has no outbox_commits row (written
// with the table's triggers disabled, for example under session_replication_role = replica),
// so they are published too. It is what the leader's janitor runs every Janitor.Interval.
func (r *Relay) Clean(ctx context.Context) error {
	j := r.cfg.Janitor
	jobs := []struct {
		table string
		keep  time.Duration // negative: skip
		sql   string        // $1: retention in seconds, $2: batch size
	}{
		{"outbox", r.cfg.KeepPublished, `DELETE FROM ` + r.t.Outbox + ` WHERE id IN (SELECT id FROM ` + r.t.Outbox + `
			WHERE state IN ('published', 'discarded') AND resolved_at < now() - make_interval(secs => $1) ORDER BY resolved_at LIMIT $2)`},
		{"outbox_commits", 0, `DELETE FROM ` + r.commits + ` WHERE txid IN (SELECT c.txid FROM ` + r.commits + ` c
			WHERE c.commit_seq IS NOT NULL AND $1::float8 = 0 -- no retention: finished is finished
			  AND NOT EXISTS (SELECT 1 FROM ` + r.t.Outbox + ` o WHERE o.txid = c.txid AND o.state IN ('pending', 'parked'))
			LIMIT $2)`},
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
			if n > 0 {
				r.janitorDeleted(job.table, n)
			}
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
	// Rows of finished transactions without a commit row: committed with the triggers off.
	tag, err := r.pool.Exec(ctx, `INSERT INTO `+r.commits+` (txid)
		SELECT DISTINCT o.txid FROM `+r.t.Outbox+` o
		 WHERE o.state IN ('pending', 'parked') AND o.txid < pg_snapshot_xmin(pg_current_snapshot())
		   AND NOT EXISTS (SELECT 1 FROM `+r.commits+` c WHERE c.txid = o.txid)
		ON CONFLICT DO NOTHING`)
	if err != nil {
		return fmt.Errorf("janitor: adopt outbox rows without a commit row: %w", err)
	}
	if n := tag.RowsAffected(); n > 0 {
		r.log.Warn("janitor adopted outbox rows written with the outbox triggers disabled; they are published now, ordered after the rows already committed",
			zap.Int64("transactions", n))
	}
	return nil
}
