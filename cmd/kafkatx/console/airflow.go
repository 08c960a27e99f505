package console

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// AirflowDriftTTL is how long the console keeps a group's Airflow drift before comparing
// again: the comparison reads Airflow's runs and asset events (a page of 100 at a time), too
// much for every page view.
const AirflowDriftTTL = time.Minute

// AirflowDrift is a group's drift between its Airflow ledger and Airflow, counted as
// `kafkatx airflow status --group G` counts it (docs/dag-triggered-services.md).
type AirflowDrift struct {
	Group string `json:"group"`
	// Entries is how many distinct runs and asset events of the ledger were compared.
	Entries int `json:"entries"`
	// Missing, Queued and Failed count the entries per kind of drift: Airflow has no such run
	// or asset event; a run queued longer than the bound; a run that failed.
	Missing int `json:"missing"`
	Queued  int `json:"queued"`
	Failed  int `json:"failed"`
	// Cleared counts the failed runs an operator's skip cleared (offsets reset --clear-airflow,
	// audited as airflow_clear): not drift.
	Cleared int `json:"cleared"`
	// NoLedger is true when the ledger has no row for the group (nothing handed to Airflow).
	NoLedger bool `json:"no_ledger"`
	// At is when the comparison ran.
	At time.Time `json:"at"`
	// Error says why the comparison failed (Airflow or the database unreachable), secrets
	// masked like every answer.
	Error string `json:"error,omitempty"`
}

// Drifted reports whether the group has drift of any kind.
func (d *AirflowDrift) Drifted() bool { return d.Missing+d.Queued+d.Failed > 0 }

// airflowCache keeps each group's last comparison for AirflowDriftTTL.
type airflowCache struct {
	mu sync.Mutex
	by map[string]AirflowDrift
}

// airflowDrift returns group's drift (cached for AirflowDriftTTL), or nil when the console has
// no Airflow access (Config.AirflowDrift nil). A failed comparison is returned with Error set
// and cached too, so an unreachable Airflow is not asked on every page view.
func (h *Handler) airflowDrift(ctx context.Context, group string) *AirflowDrift {
	if h.cfg.AirflowDrift == nil || group == "" {
		return nil
	}
	h.airflow.mu.Lock()
	if d, ok := h.airflow.by[group]; ok && time.Since(d.At) < AirflowDriftTTL {
		h.airflow.mu.Unlock()
		return &d
	}
	h.airflow.mu.Unlock()
	d, err := h.cfg.AirflowDrift(ctx, group)
	d.Group, d.At = group, time.Now()
	if err != nil {
		d = AirflowDrift{Group: group, At: d.At, Error: h.redact(err.Error())}
	}
	h.airflow.mu.Lock()
	if h.airflow.by == nil {
		h.airflow.by = map[string]AirflowDrift{}
	}
	h.airflow.by[group] = d
	h.airflow.mu.Unlock()
	return &d
}

// apiAirflowDrift answers GET /api/airflow/drift?group=G: the group's AirflowDrift; 404 when
// the console has no Airflow access.
func (h *Handler) apiAirflowDrift(w http.ResponseWriter, r *http.Request) {
	g := r.URL.Query().Get("group")
	if g == "" {
		h.fail(w, r, http.StatusBadRequest, "group is required: /api/airflow/drift?group=G")
		return
	}
	d := h.airflowDrift(r.Context(), g)
	if d == nil {
		h.fail(w, r, http.StatusNotFound, "this console has no Airflow access: start it with --airflow-url and its credentials")
		return
	}
	h.writeJSON(w, http.StatusOK, d)
}
