package engine

import (
	"time"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Emitter receives every counted event of the loop; package kafkatx implements it (Stats, its
// hooks and Prometheus metrics). Calls come from the poll loop and the partition workers,
// concurrently; an implementation must not block.
type Emitter interface {
	BatchCommitted(tp offsetstore.TP, first, next int64, t Tried, d time.Duration)
	RedeliveryDropped(tp offsetstore.TP, n int)
	RetryScheduled(tp offsetstore.TP, offset int64, attempt int, class string, backoff time.Duration)
	DeadLettered(tp offsetstore.TP, offset int64, attempts int, class string)
	Fenced(tp offsetstore.TP, expected, watermark int64)
	Reconciled(tp offsetstore.TP, drift, start int64, halted bool)
	PartitionsAssigned(starts []Position)
	PartitionsRevoked(final []Position, lost bool)
	OffsetsSkipped(tp offsetstore.TP, kind string, from, to int64)
	DependencyUnavailable(tp offsetstore.TP, offset int64, since time.Time, backoff time.Duration)
	DependencyAvailable(tp offsetstore.TP, since time.Time)
	PartitionLag(tp offsetstore.TP, watermark, logEnd int64)
	PartitionPaused(tp offsetstore.TP, bytes int64)
	// BreakerChanged: the breaker opened (open) or closed; s is its state when it changed.
	BreakerChanged(open bool, s BreakerState)
	// HandlerStuck: the handler call on offset's transaction, started at since, ran past
	// Settings.StuckAfter (stuck), or returned after that (!stuck).
	HandlerStuck(tp offsetstore.TP, offset int64, since time.Time, stuck bool)
	// LogChanged: the log behind tp's watermark is another one (identity.go); adopted says
	// the consumer adopted it (Settings.AdoptNewLog), else it halted.
	LogChanged(tp offsetstore.TP, c offsetstate.LogChange, adopted bool)
}

// Position is a partition and an offset: a start offset on assignment, a final watermark on
// revocation.
type Position struct {
	offsetstore.TP
	Offset int64
}
