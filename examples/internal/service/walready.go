package service

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// slotReady is the readiness check of an in-process WAL relay's slot (nil for a table relay):
// walrelay.Relay.NotReady as an error (a standby — a second replica of the service — is
// ready), with the slot's figures. It goes through the consumer's
// readiness (kafkatx.Consumer.AddReadinessCheck), so /readyz keeps the consumer's JSON shape.
func slotReady(rl inProcessRelay) func(context.Context) error {
	w, ok := rl.(*walrelay.Relay)
	if !ok {
		return nil
	}
	return func(context.Context) error {
		why := w.NotReady()
		if why == "" {
			return nil
		}
		hl := w.Health()
		return fmt.Errorf("the outbox's WAL relay: %s (slot %s, wal_status %q, retained %d bytes, lag %d bytes)",
			why, hl.Slot, hl.WALStatus, hl.RetainedBytes, hl.LagBytes)
	}
}
