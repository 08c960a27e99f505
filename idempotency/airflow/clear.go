package airflow

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// MaxRunNoteChars is the longest note Airflow keeps on a DAG run (its PATCH body's note,
// max_length 1000 characters); MarkRunFailed cuts a longer note to it.
const MaxRunNoteChars = 1000

// MarkRunFailed sets the state of run runID of dagID to failed with note (cut to
// MaxRunNoteChars characters), in one PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}: the run
// stays in Airflow's history with its note, and its run id stays taken (a later POST of the
// same run id answers 409), so nothing re-creates it silently. Airflow marks a running run's
// unfinished tasks failed as well: callers read the state first and mark only queued runs.
// found is false when Airflow has no such run (404). A PATCH sent twice changes nothing more,
// so temporary failures are retried like a read's. Errors as TriggerDAGRun's.
func (c *Client) MarkRunFailed(ctx context.Context, dagID, runID, note string) (run DAGRunInfo, found bool, err error) {
	if err := ValidateDAGID(dagID); err != nil {
		return DAGRunInfo{}, false, err
	}
	if err := validRunIDSegment(runID); err != nil {
		return DAGRunInfo{}, false, err
	}
	if r := []rune(note); len(r) > MaxRunNoteChars {
		note = string(r[:MaxRunNoteChars])
	}
	body, err := json.Marshal(map[string]string{"state": "failed", "note": note})
	if err != nil {
		return DAGRunInfo{}, false, err
	}
	status, err := c.idempotent(ctx, http.MethodPatch, c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID), "dagRuns", url.PathEscape(runID)), body, &run, true)
	if err != nil || status == http.StatusNotFound {
		return DAGRunInfo{}, false, err
	}
	return run, true, nil
}

// QueuedAssetEvent is one row of Airflow's asset queue (GET /api/v2/assets/{asset_id}/
// queuedEvents): the DAG DAGID, scheduled on the asset, waits for a run on the asset's events
// since CreatedAt (the first event queued since the DAG's last asset-triggered run). Airflow
// keeps one such row per asset and DAG, not one per asset event.
type QueuedAssetEvent struct {
	AssetID   int64     `json:"asset_id"`
	DAGID     string    `json:"dag_id"`
	CreatedAt time.Time `json:"created_at"`
}

// QueuedAssetEvents returns the queue rows of asset id assetID: one per DAG waiting on it
// (none when no DAG waits). Errors as TriggerDAGRun's.
func (c *Client) QueuedAssetEvents(ctx context.Context, assetID int64) ([]QueuedAssetEvent, error) {
	var out []QueuedAssetEvent
	for offset := 0; ; offset += PageSize {
		u := c.base.JoinPath("api", "v2", "assets", strconv.FormatInt(assetID, 10), "queuedEvents")
		u.RawQuery = url.Values{"limit": {strconv.Itoa(PageSize)}, "offset": {strconv.Itoa(offset)}}.Encode()
		var page struct {
			Events []QueuedAssetEvent `json:"queued_events"`
		}
		status, err := c.get(ctx, u, &page, true)
		if err != nil {
			return nil, err
		}
		if status == http.StatusNotFound {
			return out, nil
		}
		out = append(out, page.Events...)
		if len(page.Events) < PageSize {
			return out, nil
		}
	}
}

// DeleteQueuedAssetEvents deletes the queue row of asset id assetID for dagID (DELETE
// /api/v2/dags/{dag_id}/assets/{asset_id}/queuedEvents): dagID no longer waits to run on the
// asset's queued events. The asset events themselves stay in Airflow (its REST API deletes
// none), and Airflow picks an asset-triggered run's events by time — every event of the
// asset since the DAG's previous asset-triggered run — so the DAG's next asset-triggered run
// (after a new event queues it again) still lists them. deleted is false when there was no
// such row (404: nothing queued, or deleted already). Errors as TriggerDAGRun's.
func (c *Client) DeleteQueuedAssetEvents(ctx context.Context, dagID string, assetID int64) (deleted bool, err error) {
	if err := ValidateDAGID(dagID); err != nil {
		return false, err
	}
	status, err := c.idempotent(ctx, http.MethodDelete, c.base.JoinPath("api", "v2", "dags", url.PathEscape(dagID), "assets", strconv.FormatInt(assetID, 10), "queuedEvents"), nil, nil, true)
	if err != nil {
		return false, err
	}
	return status != http.StatusNotFound, nil
}
