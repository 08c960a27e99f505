package relay

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/retention"
)

// The janitor runs inside the relay, on the leader only, so one process per database does
// the deleting. Retention itself is package retention's (the WAL relay runs the same); this
// file adds the table relay's own bookkeeping. See JanitorConfig.

// cleaner is the leader's retention: package retention's jobs plus the outbox's published
// and discarded rows (KeepPublished).
func (r *Relay) cleaner() *retention.Cleaner {
	return retention.New(r.pool, r.cfg.Schema, r.cfg.Janitor, r.log, retention.WithOutbox(r.cfg.KeepPublished), retention.OnDeleted(r.janitorDeleted))
}

// runJanitor runs a janitor pass every Janitor.Interval until ctx is done.
func (r *Relay) runJanitor(ctx context.Context) {
	c := r.cleaner()
	for first := true; ; first = false {
		if !first && !sleep(ctx, r.cfg.Janitor.Interval) {
			return
		}
		if err := r.clean(ctx, c); err != nil && ctx.Err() == nil {
			r.log.Warn("janitor pass failed", zap.Error(err))
		}
	}
}

// Clean runs one retention pass now (package retention: published rows kept longer than
// KeepPublished and discarded rows resolved longer ago than that, attempt rows untouched for
// AttemptsRetention, dead letters resolved more than DeadLetterRetention ago, expired
// idempotency keys; Janitor.BatchSize rows per statement), then deletes the outbox_commits
// rows of transactions with no open row left and adopts outbox rows whose transaction has no
// outbox_commits row (written with the table's triggers disabled, for example under
// session_replication_role = replica), so they are published too. It is what the leader's
// janitor runs every Janitor.Interval.
func (r *Relay) Clean(ctx context.Context) error { return r.clean(ctx, r.cleaner()) }

func (r *Relay) clean(ctx context.Context, c *retention.Cleaner) error {
	if _, err := c.Clean(ctx); err != nil {
		return fmt.Errorf("janitor: %w", err)
	}
	for {
		tag, err := r.pool.Exec(ctx, `DELETE FROM `+r.commits+` WHERE txid IN (SELECT c.txid FROM `+r.commits+` c
			WHERE c.commit_seq IS NOT NULL -- finished is finished
			  AND NOT EXISTS (SELECT 1 FROM `+r.t.Outbox+` o WHERE o.txid = c.txid AND o.state IN ('pending', 'parked', 'packed'))
			LIMIT $1)`, r.cfg.Janitor.BatchSize)
		if err != nil {
			return fmt.Errorf("janitor: delete old outbox_commits rows: %w", err)
		}
		n := tag.RowsAffected()
		if n > 0 {
			r.janitorDeleted("outbox_commits", n)
		}
		if n < int64(r.cfg.Janitor.BatchSize) {
			break
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return nil
		}
	}
	// Rows of finished transactions without a commit row: committed with the triggers off.
	tag, err := r.pool.Exec(ctx, `INSERT INTO `+r.commits+` (txid)
		SELECT DISTINCT o.txid FROM `+r.t.Outbox+` o
		 WHERE o.state IN ('pending', 'parked', 'packed') AND o.txid < pg_snapshot_xmin(pg_current_snapshot())
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
