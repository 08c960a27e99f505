package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
)

// PageSize is the most items one list request asks Airflow for (its API serves at most 100 a
// page by default: maximum_page_limit); the list calls page through with offset.
const PageSize = 100

// maxListBody bounds the answer of one GET the client reads (a page of at most PageSize
// runs or asset events with their conf or extra).
const maxListBody = 64 << 20

// timeParam formats t as Airflow's API takes a timestamp filter (UTC, microseconds).
func timeParam(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// get sends GET u once per attempt, with the client's credentials (renewed once after a 401
// or 403 when renewable), retrying temporary failures (network errors, 408, 425, 429, 5xx)
// like a trigger, and decodes a 2xx answer into out. It returns the status of the last
// answer: a 404 is returned as (404, nil) when notFoundOK, else as a *StatusError. Errors
// that are Airflow's rather than the request's are *UnavailableError (see TriggerDAGRun).
func (c *Client) get(ctx context.Context, u *url.URL, out any, notFoundOK bool) (int, error) {
	return c.idempotent(ctx, http.MethodGet, u, nil, out, notFoundOK)
}

// idempotent sends method (GET, or a PATCH or DELETE whose repetition changes nothing more)
// with body (JSON, or nil) to u as get does.
func (c *Client) idempotent(ctx context.Context, method string, u *url.URL, body []byte, out any, notFoundOK bool) (int, error) {
	bo := &backoff.ExponentialBackOff{InitialInterval: c.cfg.InitialBackoff, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: c.cfg.MaxBackoff}
	endpoint := "/" + strings.TrimLeft(u.Path, "/")
	status, err := backoff.Retry(ctx, func() (int, error) {
		for renewed := false; ; renewed = true {
			token, err := c.bearer(ctx, renewed)
			if err != nil {
				if ctx.Err() != nil {
					return 0, backoff.Permanent(context.Cause(ctx))
				}
				return 0, backoff.Permanent(err)
			}
			status, answer, hdr, err := c.roundTrip(ctx, method, u.String(), body, token, maxListBody, method == http.MethodGet)
			if err != nil {
				if ctx.Err() != nil {
					return 0, backoff.Permanent(context.Cause(ctx))
				}
				return 0, err
			}
			switch {
			case status >= 200 && status < 300:
				if out != nil {
					if err := json.Unmarshal(answer, out); err != nil {
						return status, backoff.Permanent(fmt.Errorf("airflow: %s %s: undecodable answer: %w", method, endpoint, err))
					}
				}
				return status, nil
			case status == http.StatusNotFound && notFoundOK:
				return status, nil
			}
			se := &StatusError{StatusCode: status, Detail: strings.ToValidUTF8(string(answer[:min(len(answer), 512)]), "?"), Endpoint: method + " " + endpoint}
			if se.Auth() && !renewed && c.renewable() {
				continue
			}
			if !se.Temporary() {
				return status, backoff.Permanent(se)
			}
			if d, ok := retryAfter(hdr.Get("Retry-After")); ok {
				se.retryAfter = &backoff.RetryAfterError{Duration: min(d, c.cfg.MaxBackoff)}
			}
			return status, se
		}
	},
		backoff.WithBackOff(bo),
		backoff.WithMaxTries(uint(c.cfg.MaxAttempts)),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			c.log.Warn("Airflow request failed; retrying", zap.String("method", method), zap.String("endpoint", endpoint), zap.Duration("backoff", d), zap.Error(err))
		}))
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
			return status, err
		}
		if unavailable(err) {
			return status, &UnavailableError{Err: err}
		}
		return status, err
	}
	return status, nil
}

// DAGInfo is what the client reads of a DAG (GET /api/v2/dags/{dag_id}).
type DAGInfo struct {
	DAGID    string `json:"dag_id"`
	IsPaused bool   `json:"is_paused"`
	// MaxActiveRuns is the DAG's max_active_runs (0 when Airflow did not say).
	MaxActiveRuns int `json:"max_active_runs"`
}

// DAG reads dagID. found is false when Airflow answers 404 (no such DAG: not parsed yet, or
// deleted). Errors as TriggerDAGRun's.
func (c *Client) DAG(ctx context.Context, dagID string) (info DAGInfo, found bool, err error) {
	if err := ValidateDAGID(dagID); err != nil {
		return DAGInfo{}, false, err
	}
	status, err := c.get(ctx, c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID)), &info, true)
	if err != nil || status == http.StatusNotFound {
		return DAGInfo{}, false, err
	}
	return info, true, nil
}

// DAGRunInfo is what the client reads of a DAG run.
type DAGRunInfo struct {
	DAGID    string          `json:"dag_id"`
	RunID    string          `json:"dag_run_id"`
	State    string          `json:"state"` // queued, running, success, failed
	QueuedAt *time.Time      `json:"queued_at"`
	RunAfter *time.Time      `json:"run_after"`
	Conf     json.RawMessage `json:"conf"`
	Note     *string         `json:"note"` // the run's note (MarkRunFailed writes one)
}

// DAGRuns pages through dagID's runs, newest first (order_by=-run_after, PageSize a page),
// calling each for every run until each returns false or the runs end; runAfterGTE, when not
// zero, keeps only runs whose run_after is at or after it (Airflow filters). A DAG Airflow
// does not know ends the listing with no runs (found false). Errors as TriggerDAGRun's.
func (c *Client) DAGRuns(ctx context.Context, dagID string, runAfterGTE time.Time, each func(DAGRunInfo) bool) (found bool, err error) {
	if err := ValidateDAGID(dagID); err != nil {
		return false, err
	}
	for offset := 0; ; offset += PageSize {
		u := c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID), "dagRuns")
		q := url.Values{"limit": {strconv.Itoa(PageSize)}, "offset": {strconv.Itoa(offset)}, "order_by": {"-run_after"}}
		if !runAfterGTE.IsZero() {
			q.Set("run_after_gte", timeParam(runAfterGTE))
		}
		u.RawQuery = q.Encode()
		var page struct {
			Runs []DAGRunInfo `json:"dag_runs"`
		}
		status, err := c.get(ctx, u, &page, true)
		if err != nil {
			return false, err
		}
		if status == http.StatusNotFound {
			return false, nil
		}
		for _, r := range page.Runs {
			if !each(r) {
				return true, nil
			}
		}
		if len(page.Runs) < PageSize {
			return true, nil
		}
	}
}

// DAGRun reads one run by its id; found is false on 404. Errors as TriggerDAGRun's.
func (c *Client) DAGRun(ctx context.Context, dagID, runID string) (run DAGRunInfo, found bool, err error) {
	if err := ValidateDAGID(dagID); err != nil {
		return DAGRunInfo{}, false, err
	}
	if err := validRunIDSegment(runID); err != nil {
		return DAGRunInfo{}, false, err
	}
	status, err := c.get(ctx, c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID), "dagRuns", url.PathEscape(runID)), &run, true)
	if err != nil || status == http.StatusNotFound {
		return DAGRunInfo{}, false, err
	}
	return run, true, nil
}

// RunningRuns returns how many of dagID's runs are in state running (total_entries of one
// GET with limit=1). Errors as TriggerDAGRun's.
func (c *Client) RunningRuns(ctx context.Context, dagID string) (int, error) {
	if err := ValidateDAGID(dagID); err != nil {
		return 0, err
	}
	u := c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID), "dagRuns")
	u.RawQuery = url.Values{"limit": {"1"}, "state": {"running"}}.Encode()
	var page struct {
		Total int `json:"total_entries"`
	}
	if _, err := c.get(ctx, u, &page, false); err != nil {
		return 0, err
	}
	return page.Total, nil
}
