package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// mode returns the outbox mode the relay serves: the stored one, which --outbox-mode must
// match (exit 2 otherwise). A schema whose mode was never chosen takes --outbox-mode only
// with --migrate (set-up creates the slot, never the relay alone).
func (c *RelayCmd) mode(ctx context.Context, sp *pgxpool.Pool, schema string) (outbox.Mode, error) {
	want := outbox.Mode(c.OutboxMode)
	st, err := outbox.ReadSettings(ctx, sp, schema)
	if err != nil {
		return "", err
	}
	switch {
	case want == "" || want == st.Mode:
		return st.Mode, nil
	case !st.Chosen && c.Migrate:
		return outbox.EnsureMode(ctx, sp, schema, want)
	case !st.Chosen:
		return "", &exitError{code: exitUsage, err: fmt.Errorf("--outbox-mode %s: schema %s's outbox is in %s mode; set it first with kafkatx migrate up --outbox-mode %s --schema %s (or add --migrate)",
			want, schema, st.Mode, want, shellQuote(schema))}
	}
	return "", &exitError{code: exitUsage, err: fmt.Errorf("--outbox-mode %s conflicts with schema %s's stored outbox mode %s (switch with kafkatx migrate up --outbox-mode %s)",
		want, schema, st.Mode, want)}
}

// runWAL runs the WAL relay (package outbox/walrelay) on sp's connection settings.
func (c *RelayCmd) runWAL(ctx context.Context, g *Globals, pool, sp *pgxpool.Pool, kcfg kafka.ConfigMap, reg *prometheus.Registry, log *zap.Logger) error {
	rl, err := walrelay.New(pool, walrelay.Config{Kafka: kcfg, Schema: g.Schema, Logger: log, Replication: sp.Config().ConnConfig, Registerer: reg, Retention: c.retention()})
	if err != nil {
		return err
	}
	readyz := func(w http.ResponseWriter, _ *http.Request) {
		h, s := rl.Health(), rl.Stats()
		body, _ := json.Marshal(map[string]any{"streaming": s.Streaming, "slot": h.Slot, "wal_status": h.WALStatus,
			"slot_retained_bytes": h.RetainedBytes, "slot_lag_bytes": h.LagBytes, "slot_safe_bytes": h.SafeBytes, "published": s.Published, "parked": s.Parked})
		w.Header().Set("Content-Type", "application/json")
		if !s.Streaming || !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write(append(body, '\n')) //nolint:errcheck
	}
	return c.runRelay(ctx, rl, reg, readyz, log, func() {
		s := rl.Stats()
		out, _ := json.Marshal(map[string]int64{"published": s.Published, "parked": s.Parked, "transactions": s.Transactions})
		log.Debug("where the stream's time went", zap.Duration("receive", s.Steps.Receive), zap.Duration("handle", s.Steps.Handle),
			zap.Duration("queue_full", s.Steps.QueueFull), zap.Duration("commit", s.Steps.Commit))
		fmt.Println(string(out))
	})
}
