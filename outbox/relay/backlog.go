package relay

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Backlog returns the number of outbox records waiting to be published and the age of the
// oldest (0 when none), by the database clock. Parked rows and the rows of their keys that
// wait behind them are not counted (a packed row counts its records, all of them: which of
// them wait behind a parked row is known only once the pack is read): they need an operator, not the relay. One indexed query
// over the pending rows; a service uses it to refuse to exit idle while rows wait.
func (r *Relay) Backlog(ctx context.Context) (count int64, oldest time.Duration, err error) {
	var secs float64
	err = r.pool.QueryRow(ctx, `SELECT coalesce(sum(o.pack_count), 0), coalesce(extract(epoch FROM clock_timestamp() - min(o.created_at)), 0)::float8
		FROM `+r.t.Outbox+` o
		WHERE o.state IN ('pending', 'packed')
		  AND `+r.notBehindParked()).Scan(&count, &secs)
	if err != nil {
		return 0, 0, fmt.Errorf("relay: read outbox backlog: %w", err)
	}
	return count, time.Duration(max(secs, 0) * float64(time.Second)), nil
}

// Pending reports whether any outbox row waits to be published (parked rows and the rows of
// their keys excluded, as in Backlog). Unlike Backlog it stops at the first such row, so it
// costs one index probe however long the backlog is: use it to ask "is the outbox drained?"
// often (Backlog counted 190,000 pending rows in 160 ms; asked 10 times a second it took a
// PostgreSQL core).
//
// While this relay leads and its last round, less than a second ago, read a full batch, it
// answers true without a query: more rows were waiting then and the leader is on them. (The
// probe scans the table when dead rows fill its head: 12 ms a probe with 150,000 rows behind
// a draining leader, asked 10 times a second by the example service's idle exit.)
func (r *Relay) Pending(ctx context.Context) (bool, error) {
	if at := r.fullRoundAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < time.Second && r.c.leader.Load() {
		return true, nil
	}
	var pending bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+r.t.Outbox+` o
		WHERE o.state IN ('pending', 'packed')
		  AND `+r.notBehindParked()+`)`).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("relay: read outbox backlog: %w", err)
	}
	return pending, nil
}

// notBehindParked is the SQL condition that outbox row o (aliased o) does not wait behind a
// parked row of its (topic, key): such rows belong to an operator, not to the relay. Backlog,
// Pending and the round's read share it.
//
// The first arm, uncorrelated, is evaluated once per statement (an InitPlan: one probe of
// outbox_parked_idx) and is true while no row is parked, the usual state, so the per-row
// check is not run at all. Without it the planner chose, from the statistics, between
// probing the parked index once per row read (2 buffers a row, 2,000 a 1,000-row round:
// 400,000–520,000 buffers for the reads of a 300,000-event run against 84,000 when it
// materialized the empty result) and materializing it; with rows parked the second arm is
// the check as before (TestReadProbesTheParkedRowsOnce).
//
// The index holds md5(topic) and sha256(key), not the values (migration 012: a key of 2,700
// bytes or more did not fit in a B-tree entry, and parking its record failed); the check
// compares the hashes, which the index answers, then the values.
func (r *Relay) notBehindParked() string {
	return r.notBehindParkedIf(`NOT EXISTS (SELECT 1 FROM ` + r.t.Outbox + ` p0 WHERE p0.state = 'parked')`)
}

// notBehindParkedIf is notBehindParked with its first arm given: noneParked, an uncorrelated
// condition that holds while no row is parked (the round's read computes it once for the
// statement, and also returns it: any_parked).
func (r *Relay) notBehindParkedIf(noneParked string) string {
	return `(` + noneParked + `
		OR NOT EXISTS (SELECT 1 FROM ` + r.t.Outbox + ` p WHERE p.state = 'parked'
			AND md5(p.topic) = md5(o.topic) AND sha256(p.key) = sha256(o.key) AND p.topic = o.topic AND p.key = o.key))`
}

// parkedRows counts the parked rows.
func (r *Relay) parkedRows(ctx context.Context) (int64, error) {
	var n int64
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.t.Outbox+` WHERE state = 'parked'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("relay: count parked outbox rows: %w", err)
	}
	return n, nil
}

// refreshGauges sets the backlog, oldest-age and parked gauges every MetricsInterval, or
// less often while counting is slow: it waits at least 20 times the last count's duration,
// so the count never takes more than 5% of a PostgreSQL core however long the backlog.
func (r *Relay) refreshGauges(ctx context.Context) {
	for {
		start := time.Now()
		n, age, err := r.Backlog(ctx)
		if err == nil {
			var parked int64
			parked, err = r.parkedRows(ctx)
			r.backlogMeasured(n, age, parked)
		}
		if err != nil && ctx.Err() == nil {
			r.log.Debug("refresh outbox gauges", zap.Error(err))
		}
		if !sleep(ctx, max(r.cfg.MetricsInterval, 20*time.Since(start))) {
			return
		}
	}
}
