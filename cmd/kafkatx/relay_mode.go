package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/outbox/relays"
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
	return "", &exitError{code: exitUsage, err: fmt.Errorf("--outbox-mode %s conflicts with schema %s's stored outbox mode %s (%s)",
		want, schema, st.Mode, outbox.SwitchSteps(schema, st.Mode, want))}
}

// readyz is /readyz of rl: in table mode, the leader's last contact with the database is
// recent (within 3 poll or standby intervals, at least 5 s); in WAL mode, the relay streams
// the slot or stands by while another streams it, and the slot is ready
// (walrelay.Relay.NotReady); in both, the relay's own Ready (its rounds or stream have not
// failed, its brokers are not all down, for NotReadyAfter), whose error is the body's
// "reason". The body is the relay's figures as JSON.
func (c *RelayCmd) readyz(rl relays.Relay) http.HandlerFunc {
	stale := max(5*time.Second, 3*c.PollInterval, 3*c.StandbyInterval)
	return func(w http.ResponseWriter, req *http.Request) {
		var body map[string]any
		ready := true
		switch r := rl.(type) {
		case *walrelay.Relay:
			h, s := r.Health(), r.Stats()
			body = map[string]any{"leader": s.Streaming, "streaming": s.Streaming, "standby": s.Standby, "slot": h.Slot, "wal_status": h.WALStatus,
				"slot_retained_bytes": h.RetainedBytes, "slot_lag_bytes": h.LagBytes, "slot_safe_bytes": h.SafeBytes, "published": s.Published, "parked": s.Parked}
			// A standby (another relay streams the slot) is ready, as a table relay's standby is.
			if why := r.NotReady(); why != "" {
				ready = false
				body["reason"] = why
			}
		case *relay.Relay:
			s := r.Stats()
			age := time.Since(s.LastContact)
			body = map[string]any{"leader": s.Leader, "published": s.Published, "parked": s.Parked, "last_database_contact_seconds": age.Seconds()}
			if ready = age <= stale; !ready {
				body["reason"] = fmt.Sprintf("no database round trip for %.0f s (more than %s)", age.Seconds(), stale)
			}
		}
		if err := rl.Ready(req.Context()); err != nil {
			ready = false
			body["reason"] = err.Error()
		}
		out, _ := json.Marshal(body)
		w.Header().Set("Content-Type", "application/json")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write(append(out, '\n')) //nolint:errcheck
	}
}
