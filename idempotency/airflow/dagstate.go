package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/promreg"
	"github.com/kafkatx/kafkatx/limit"
)

// A paused DAG is never silent. Airflow answers POST dagRuns with 200 for a paused DAG and the
// run then waits, queued, until someone unpauses it — and a new DAG starts paused
// (apache/airflow#71381). So before a create the client reads the DAG's is_paused
// (GET /api/v2/dags/{dag_id}), caches it per DAG, and reports a paused DAG: one log line per
// change, the kafkatx_airflow_dag_paused gauge, Client.ReadinessNote, Result.Paused — and
// applies DAGStateConfig.WhenPaused.

// PausedPolicy is what TriggerDAGRun does for a DAG Airflow reports paused
// (DAGStateConfig.WhenPaused).
type PausedPolicy string

const (
	// PausedPost posts the run anyway and reports it (Result.Paused, the log, the metric, the
	// readiness note): Airflow queues the run, and it starts once the DAG is unpaused. Nothing
	// is lost and the partition's other events go on. The default: holding would stall every
	// event of the partition behind one DAG's pause, and a pause longer than the consumer's
	// Unavailable wait (kafkatx Config.UnavailableMaxWait, 30 minutes by default) would turn
	// the held events into attempts and then dead letters.
	PausedPost PausedPolicy = "post"
	// PausedHold posts nothing while the DAG is paused: TriggerDAGRun returns an
	// *UnavailableError wrapping a *PausedError, so a kafkatx handler's partition waits,
	// spending no attempt (kafkatx.IsUnavailable), and tries again; the run is posted once a
	// read finds the DAG unpaused — within DAGStateConfig.Interval of the unpause, plus the
	// consumer's backoff (at most 10 s). The wait is bounded like any Unavailable wait
	// (kafkatx Config.UnavailableMaxWait): past it the tries count as attempts.
	PausedHold PausedPolicy = "hold"
)

// DefaultDAGStateInterval is DAGStateConfig.Interval's default: 30 s.
const DefaultDAGStateInterval = 30 * time.Second

// DAGStateConfig configures the client's reads of a DAG's is_paused (Config.DAGState).
type DAGStateConfig struct {
	// Interval is how long a DAG's state read by GET /api/v2/dags/{dag_id} is reused before
	// the next trigger of that DAG reads it again: at most one read per DAG per Interval,
	// whatever the number of triggers (concurrent triggers share one read). A DAG Airflow does
	// not know (404) is read again at its next trigger, and a known DAG's state is dropped —
	// read again at the next trigger — when a create answers 404 (the DAG was deleted; a DAG
	// re-created starts paused). Defaults to DefaultDAGStateInterval (30 s); negative: the
	// state is never read, nothing is reported and WhenPaused does not apply (the client
	// posts as it did before it read is_paused).
	Interval time.Duration

	// WhenPaused is what a trigger of a paused DAG does: PausedPost (the default) or
	// PausedHold. A state that could not be read (an error, an answer without is_paused) is
	// treated as not paused: the run is posted.
	WhenPaused PausedPolicy

	// Registerer, when set, receives the gauge kafkatx_airflow_dag_paused{dag_id} (1 while the
	// last read found the DAG paused, 0 once it found it unpaused, not found or unreadable)
	// and the counter kafkatx_airflow_paused_triggers_total{dag_id,outcome} (outcome "posted":
	// a run posted to a paused DAG, queued until it is unpaused; "held": a trigger held by
	// PausedHold). Two clients sharing a registry share the collectors. Defaults to none.
	Registerer prometheus.Registerer
}

// DAGStatus is what the last read of a DAG found.
type DAGStatus string

const (
	DAGActive   DAGStatus = "active"    // is_paused false: runs start
	DAGPaused   DAGStatus = "paused"    // is_paused true: runs stay queued until it is unpaused
	DAGNotFound DAGStatus = "not_found" // 404: not parsed yet, or deleted; creates answer 404 too
	DAGUnknown  DAGStatus = "unknown"   // the read failed or the answer had no is_paused: posted as if active
)

// DAGState is what the client last read of one DAG.
type DAGState struct {
	DAGID  string    `json:"dag_id"`
	Status DAGStatus `json:"status"`
	// Since is when the client first read this Status (after another, or at its first read).
	Since time.Time `json:"since"`
	// ReadAt is the last read.
	ReadAt time.Time `json:"read_at"`
	// Error is why Status is DAGUnknown: the read's error or Airflow's answer.
	Error string `json:"error,omitempty"`
}

// PausedError is a trigger held because Airflow reports its DAG paused
// (DAGStateConfig.WhenPaused PausedHold). TriggerDAGRun returns it inside an *UnavailableError:
// nothing was posted.
type PausedError struct {
	DAGID string
	Since time.Time // when the client first read it paused
}

func (e *PausedError) Error() string {
	return fmt.Sprintf("airflow: DAG %s is paused (read paused since %s): its run is held until the DAG is unpaused (DAGStateConfig.WhenPaused hold); nothing was posted",
		e.DAGID, e.Since.UTC().Format(time.RFC3339))
}

// IsPaused reports whether err or an error it wraps is a *PausedError.
func IsPaused(err error) bool {
	var pe *PausedError
	return errors.As(err, &pe)
}

// ValidatePausedPolicy refuses a policy other than "", PausedPost and PausedHold.
func ValidatePausedPolicy(p PausedPolicy) error {
	switch p {
	case "", PausedPost, PausedHold:
		return nil
	}
	return fmt.Errorf("airflow: DAGStateConfig.WhenPaused %q: want %q or %q", string(p), PausedPost, PausedHold)
}

// dagStates is the client's cache of DAG states (one entry per DAG id triggered).
type dagStates struct {
	c        *Client
	interval time.Duration // < 0: off
	policy   PausedPolicy
	paused   *prometheus.GaugeVec
	triggers *prometheus.CounterVec

	mu sync.Mutex
	m  map[string]*dagEntry
}

type dagEntry struct {
	state   DAGState
	fresh   bool          // state may be reused until state.ReadAt + interval
	reading chan struct{} // non-nil while a read is in flight; closed when it ends
}

func newDAGStates(c *Client, cfg DAGStateConfig) (*dagStates, error) {
	if err := ValidatePausedPolicy(cfg.WhenPaused); err != nil {
		return nil, err
	}
	d := &dagStates{c: c, interval: cfg.Interval, policy: cfg.WhenPaused, m: map[string]*dagEntry{}}
	if d.interval == 0 {
		d.interval = DefaultDAGStateInterval
	}
	if d.policy == "" {
		d.policy = PausedPost
	}
	d.paused = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kafkatx_airflow_dag_paused",
		Help: "1 while the Airflow client's last read of the DAG found it paused (its runs stay queued until it is unpaused), else 0."}, []string{"dag_id"})
	d.triggers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kafkatx_airflow_paused_triggers_total",
		Help: "Triggers of a DAG read as paused: outcome posted (the run is queued until the DAG is unpaused) or held (nothing posted; the caller waits)."}, []string{"dag_id", "outcome"})
	var err error
	promreg.Into(cfg.Registerer, &d.paused, &err)
	promreg.Into(cfg.Registerer, &d.triggers, &err)
	if err != nil {
		return nil, fmt.Errorf("airflow: %w", err)
	}
	return d, nil
}

// before reads dag's state (cached) ahead of a create. It returns whether the DAG is read as
// paused, and for PausedHold an *UnavailableError wrapping a *PausedError. ctx ending during a
// read returns the context's error.
func (d *dagStates) before(ctx context.Context, dag string) (bool, error) {
	if d == nil || d.interval < 0 {
		return false, nil
	}
	s, err := d.get(ctx, dag)
	if err != nil {
		return false, err
	}
	if s.Status != DAGPaused {
		return false, nil
	}
	if d.policy == PausedHold {
		d.triggers.WithLabelValues(dag, "held").Inc()
		return true, &UnavailableError{Err: &PausedError{DAGID: dag, Since: s.Since}}
	}
	return true, nil
}

// after takes a create's outcome: posted to a paused DAG is counted; a 404 drops a known
// DAG's state, so the next trigger reads it again (a DAG deleted, or re-created paused).
func (d *dagStates) after(dag string, paused bool, err error) {
	if d == nil || d.interval < 0 {
		return
	}
	var se *StatusError
	if errors.As(err, &se) && se.StatusCode == http.StatusNotFound {
		d.mu.Lock()
		if e := d.m[dag]; e != nil {
			e.fresh = false
		}
		d.mu.Unlock()
		return
	}
	if err == nil && paused {
		d.triggers.WithLabelValues(dag, "posted").Inc()
	}
}

// get returns dag's state: the cached one while it is fresh, else the result of one read,
// shared by the triggers that ask while it is in flight.
func (d *dagStates) get(ctx context.Context, dag string) (DAGState, error) {
	d.mu.Lock()
	e := d.m[dag]
	if e == nil {
		e = &dagEntry{state: DAGState{DAGID: dag}}
		d.m[dag] = e
	}
	if e.fresh && time.Since(e.state.ReadAt) < d.interval {
		s := e.state
		d.mu.Unlock()
		return s, nil
	}
	if ch := e.reading; ch != nil {
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return DAGState{}, context.Cause(ctx)
		}
		d.mu.Lock()
		s := e.state
		d.mu.Unlock()
		return s, nil
	}
	ch := make(chan struct{})
	e.reading = ch
	d.mu.Unlock()

	status, detail := d.c.readDAG(ctx, dag)

	d.mu.Lock()
	defer d.mu.Unlock()
	e.reading = nil
	defer close(ch)
	if ctx.Err() != nil {
		return DAGState{}, context.Cause(ctx)
	}
	now := time.Now()
	prev := e.state
	e.state.ReadAt, e.state.Error = now, detail
	// A DAG Airflow does not know is read again at its next trigger: it is often parsed after
	// its first event, and may then start paused.
	e.fresh = status != DAGNotFound
	if status != prev.Status {
		e.state.Status, e.state.Since = status, now
		d.logChange(prev, e.state)
	}
	if status == DAGPaused {
		d.paused.WithLabelValues(dag).Set(1)
	} else {
		d.paused.WithLabelValues(dag).Set(0)
	}
	return e.state, nil
}

// logChange logs one line for a DAG whose read status changed.
func (d *dagStates) logChange(prev, s DAGState) {
	log := d.c.log.With(zap.String("dag_id", s.DAGID), zap.String("status", string(s.Status)), zap.String("when_paused", string(d.policy)))
	if prev.Status != "" {
		log = log.With(zap.String("previous", string(prev.Status)), zap.Duration("previous_for", s.Since.Sub(prev.Since)))
	}
	switch s.Status {
	case DAGPaused:
		if d.policy == PausedHold {
			log.Warn("Airflow reports the DAG paused: its runs are held, nothing is posted and the caller waits until it is unpaused (when_paused hold)")
		} else {
			log.Warn("Airflow reports the DAG paused: runs posted stay queued until it is unpaused (when_paused post)")
		}
	case DAGActive:
		log.Info("Airflow reports the DAG unpaused: its runs start")
	case DAGNotFound:
		log.Warn("Airflow does not know the DAG (404: not parsed yet, or deleted): creates wait for it")
	default:
		log.Warn("cannot read the DAG's is_paused; triggering as if it were unpaused", zap.String("error", s.Error))
	}
}

// readDAG GETs /api/v2/dags/{dag} once (again after a 401 or 403 with renewable
// credentials) and returns what it says; detail is the error for DAGUnknown.
func (c *Client) readDAG(ctx context.Context, dag string) (DAGStatus, string) {
	u := c.base.JoinPath("api", "v2", "dags", url.PathEscape(dag))
	for renewed := false; ; renewed = true {
		token, err := c.bearer(ctx, renewed)
		if err != nil {
			return DAGUnknown, err.Error()
		}
		status, body, err := c.getUnmeasured(ctx, u.String(), token)
		if err != nil {
			return DAGUnknown, err.Error()
		}
		if (status == http.StatusUnauthorized || status == http.StatusForbidden) && !renewed && c.renewable() {
			continue
		}
		switch status {
		case http.StatusOK:
			var out struct {
				IsPaused *bool `json:"is_paused"`
			}
			if json.Unmarshal(body, &out) != nil || out.IsPaused == nil {
				return DAGUnknown, "GET " + u.Path + " answered 200 without is_paused"
			}
			if *out.IsPaused {
				return DAGPaused, ""
			}
			return DAGActive, ""
		case http.StatusNotFound:
			return DAGNotFound, ""
		}
		head := strings.ToValidUTF8(string(body[:min(len(body), 512)]), "?")
		return DAGUnknown, fmt.Sprintf("GET %s answered %d %s: %s", u.Path, status, http.StatusText(status), head)
	}
}

// DAGStates returns what the client last read of each DAG it triggered, by DAG id; it sends
// nothing. Empty when DAGStateConfig.Interval is negative.
func (c *Client) DAGStates() []DAGState {
	d := c.dags
	if d == nil {
		return nil
	}
	d.mu.Lock()
	out := make([]DAGState, 0, len(d.m))
	for _, e := range d.m {
		if e.state.Status != "" {
			out = append(out, e.state)
		}
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].DAGID < out[j].DAGID })
	return out
}

// ReadinessNote returns one sentence per DAG whose last read found it paused, unknown to
// Airflow or unreadable, joined by "; ", or "" when every DAG read is active (or none was
// read). It sends nothing. For a readiness report that keeps the process ready
// (kafkatx.Consumer.AddReadinessNote): a paused DAG is a state of Airflow that a restart of
// the caller would not change.
func (c *Client) ReadinessNote() string {
	var notes []string
	policy := PausedPost
	if c.dags != nil {
		policy = c.dags.policy
	}
	for _, s := range c.DAGStates() {
		since := s.Since.UTC().Format(time.RFC3339)
		switch s.Status {
		case DAGPaused:
			if policy == PausedHold {
				notes = append(notes, fmt.Sprintf("DAG %s is paused (since %s): its runs are held, their partitions wait without spending attempts until it is unpaused (when paused: hold)", s.DAGID, since))
			} else {
				notes = append(notes, fmt.Sprintf("DAG %s is paused (since %s): runs posted stay queued in Airflow until it is unpaused (when paused: post)", s.DAGID, since))
			}
		case DAGNotFound:
			notes = append(notes, fmt.Sprintf("DAG %s is not known to Airflow (404 since %s: not parsed yet, or deleted): its creates wait", s.DAGID, since))
		case DAGUnknown:
			notes = append(notes, fmt.Sprintf("DAG %s: its is_paused cannot be read (since %s: %s); runs are posted as if it were unpaused", s.DAGID, since, s.Error))
		}
	}
	return strings.Join(notes, "; ")
}

// getUnmeasured sends one GET under a permit of Config.Limiter, like every request, but feeds
// the limit nothing (limit.Ignored): a DAG read answers in a few milliseconds, or at once with
// 501 from a stand-in, and taken as a latency sample (or a drop) it would hold the adaptive
// limit far below what the creates can use (measured: 2,400 creates of 200 ms each at 151
// runs/s instead of 423 with one read taken as a sample). It returns the status and up to
// 256 KiB of the body.
func (c *Client) getUnmeasured(ctx context.Context, u, token string) (int, []byte, error) {
	permit, err := c.cfg.Limiter.Acquire(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer permit.Done(limit.Ignored)
	actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kafkatx-airflow/1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, nil
}
