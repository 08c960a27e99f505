package service

import (
	"os"
	"runtime/debug"
)

// GCPercent is the garbage collector target the example services run with unless GOGC is set.
// At Go's default (100) the order service spent about 10% of its CPU marking a small live heap
// (batches of short-lived messages); at 400 its drain of 300,000 orders ran 5% faster (mean of
// three runs, docs/benchmarks.md) and peak RSS stays far below the 200 MB goal.
const GCPercent = 400

// TuneGC sets GCPercent unless the environment sets GOGC, which wins.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
}
