package service

import (
	"context"
	"fmt"

	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// slotReady is the readiness check of the in-process WAL relays' slots (nil when none is a
// WAL relay): walrelay.Relay.NotReady as an error (a standby — a second replica of the
// service — is ready), with the slot's figures, naming the shard of a sharded service's relay.
// It goes through the consumer's readiness (kafkatx.Consumer.AddReadinessCheck), so /readyz
// keeps the consumer's JSON shape.
func slotReady(rl inProcessRelay) func(context.Context) error {
	var names []string
	var ws []*walrelay.Relay
	if m, ok := rl.(*shardRelays); ok {
		for i, r := range m.rs {
			if w, ok := r.(*walrelay.Relay); ok {
				names, ws = append(names, m.names[i]), append(ws, w)
			}
		}
	} else if w, ok := rl.(*walrelay.Relay); ok {
		names, ws = []string{""}, []*walrelay.Relay{w}
	}
	if len(ws) == 0 {
		return nil
	}
	return func(context.Context) error {
		for i, w := range ws {
			why := w.NotReady()
			if why == "" {
				continue
			}
			hl := w.Health()
			err := fmt.Errorf("the outbox's WAL relay: %s (slot %s, wal_status %q, retained %d bytes, lag %d bytes)",
				why, hl.Slot, hl.WALStatus, hl.RetainedBytes, hl.LagBytes)
			if names[i] != "" {
				err = fmt.Errorf("shard %s: %w", names[i], err)
			}
			return err
		}
		return nil
	}
}
