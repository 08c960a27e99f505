package service

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// slotReady is the readiness check of an in-process WAL relay's slot (nil for a table relay):
// an error while the relay neither streams the slot nor stands by while another relay streams
// it (walrelay.Stats.Standby: a second replica of the service), or the slot is missing or lost
// (walrelay.Health), naming why and the slot's figures. It goes through the consumer's
// readiness (kafkatx.Consumer.AddReadinessCheck), so /readyz keeps the consumer's JSON shape.
func slotReady(rl inProcessRelay) func(context.Context) error {
	w, ok := rl.(*walrelay.Relay)
	if !ok {
		return nil
	}
	return func(context.Context) error {
		hl, st := w.Health(), w.Stats()
		why := hl.NotReady()
		if why == "" && !st.Streaming && !st.Standby {
			why = "not streaming the replication slot yet (the stream is being opened)"
		}
		if why == "" {
			return nil
		}
		return fmt.Errorf("the outbox's WAL relay: %s (slot %s, wal_status %q, retained %d bytes, lag %d bytes)",
			why, hl.Slot, hl.WALStatus, hl.RetainedBytes, hl.LagBytes)
	}
}
