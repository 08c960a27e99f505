package service

import (
	"encoding/json"
	"net/http"

	"github.com/kafkatx/kafkatx/outbox/walrelay"
)

// withOutboxSlot makes /readyz answer 503 while the in-process WAL relay does not stream or
// its slot is missing or lost (walrelay.Health), with the slot's figures in the JSON body;
// otherwise (and for every other path, or a table relay) h answers.
func withOutboxSlot(h http.Handler, rl inProcessRelay) http.Handler {
	w, ok := rl.(*walrelay.Relay)
	if !ok {
		return h
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			h.ServeHTTP(rw, r)
			return
		}
		hl, st := w.Health(), w.Stats()
		if st.Streaming && hl.Ready() {
			h.ServeHTTP(rw, r)
			return
		}
		body, _ := json.Marshal(map[string]any{"ready": false, "reason": "the outbox's WAL relay is not streaming from its slot",
			"slot": hl.Slot, "slot_missing": hl.Missing, "wal_status": hl.WALStatus, "slot_retained_bytes": hl.RetainedBytes,
			"slot_lag_bytes": hl.LagBytes, "slot_safe_bytes": hl.SafeBytes})
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusServiceUnavailable)
		_, _ = rw.Write(append(body, '\n'))
	})
}
