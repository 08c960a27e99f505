package relay

import "github.com/kafkatx/kafkatx/outbox/internal/publish"

// outcome is what a delivery result means for the row.
type outcome int

const (
	outcomeNone      outcome = iota // not produced this round (its key is blocked): stays pending
	outcomeDelivered                // acknowledged by the broker
	outcomeRetry                    // retriable failure: stays pending, tried again after a backoff
	outcomePark                     // refused for good: parked with its error
	outcomeIsolate                  // refused with a record-level error while batched: try it alone
)

// classify maps a produce or delivery error to the row's outcome by the refusal classes both
// relays share (publish.Classify: which codes park, isolate or retry, and why). alone says
// whether the record was the only one of its partition in flight.
func classify(err error, alone bool) outcome {
	switch c, _ := publish.Classify(err, alone); c {
	case publish.Park:
		return outcomePark
	case publish.Isolate:
		return outcomeIsolate
	}
	return outcomeRetry
}
