package kafkatx

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Consumer's counters since Run started.
type Stats struct {
	// Processed counts messages whose handler effects committed.
	Processed int64
	// Duplicates counts messages dropped without running the handler because they were done
	// before: their offset was already below the watermark (a redelivery after a rebalance or
	// a lost Kafka commit), or their business idempotency key (Config.Idempotency) was already
	// claimed in the group's replay epoch (a copy re-published at another offset).
	Duplicates int64
	// Retries counts tries after the first, crashes excluded, as they are scheduled (before
	// their backoff; HookRetryScheduled): a retry whose backoff a shutdown or revocation cut
	// short is counted here and its try runs on the partition's next owner.
	Retries int64
	// DeadLettered counts messages this consumer dead-lettered.
	DeadLettered int64
	// SkippedOffsets counts offsets skipped by following Kafka (operator or unexplained).
	SkippedOffsets int64
	// RolledBackOffsets counts offsets re-processed because the database lost them (a
	// failover, a restore: audit kind rollback_replayed), on assignment or while running.
	RolledBackOffsets int64
	// Pauses counts the times a partition stopped fetching because the messages held for it
	// exceeded its share of Config.MaxBufferedBytes (it resumes at half its share).
	Pauses int64
	// NotChanges counts records the idempotency key function reported as not a change
	// (idempotency.ErrNotAChange: Debezium tombstones, heartbeats, transaction metadata):
	// committed past without running the handler, never dead-lettered.
	NotChanges int64
	// Assigned is the number of partitions currently assigned.
	Assigned int
	// InFlight is the number of received messages not yet committed, dead-lettered or
	// dropped, including those waiting in a backoff and those parked (Config.Park) in the
	// assigned partitions.
	InFlight int
	// FirstAssignedAt is when the consumer first held an assignment (zero before).
	FirstAssignedAt time.Time
	// LastMessageAt is when the last message arrived from Kafka (zero before).
	LastMessageAt time.Time
	// Unavailable counts handler answers of Unavailable that the loop waited out (each a
	// rolled-back try that counted no attempt).
	Unavailable int64
	// Waiting is the number of assigned partitions now waiting for a dependency their handler
	// reported Unavailable (their messages count in InFlight).
	Waiting int
	// BreakerOpens counts the times the breaker opened (Config.Breaker; HookBreakerChanged);
	// Readiness.Breaker says whether it is open now.
	BreakerOpens int64
	// HeldBack is the number of assigned partitions now waiting in Config.Backpressure before
	// a transaction (their messages count in InFlight).
	HeldBack int
}

// counters are the Stats counters the emitter moves.
type counters struct {
	processed, duplicates, retries, deadLettered, skipped, pauses, notChanges atomic.Int64
	rolledBack, unavailable, breakerOpens                                     atomic.Int64
}

// load is the counters' part of Stats.
func (c *counters) load() Stats {
	return Stats{
		Processed:         c.processed.Load(),
		Duplicates:        c.duplicates.Load(),
		Retries:           c.retries.Load(),
		DeadLettered:      c.deadLettered.Load(),
		SkippedOffsets:    c.skipped.Load(),
		RolledBackOffsets: c.rolledBack.Load(),
		Pauses:            c.pauses.Load(),
		NotChanges:        c.notChanges.Load(),
		Unavailable:       c.unavailable.Load(),
		BreakerOpens:      c.breakerOpens.Load(),
	}
}
