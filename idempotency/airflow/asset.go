package airflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
)

// KafkatxIDKey is the key of an asset event's extra that carries its kafkatx id: unique per
// Kafka event and stable across retries, crashes and replays (examples/dagtrigger derives it
// from the event's idempotency key, as a DAG run's id: RunID). Airflow keeps no idempotency
// key of its own for asset events (apache/airflow#49900): this id is how a create is settled
// and how `kafkatx airflow status` finds the event.
const KafkatxIDKey = "kafkatx_id"

// AssetSettleMargin is how far before a create (or before an earlier try's pending mark) the
// client reads Airflow's asset events back to settle it: 5 minutes, room for the clocks of
// kafkatx's host and Airflow's database to disagree.
const AssetSettleMargin = 5 * time.Minute

// AssetEvent describes one asset event to create (POST /api/v2/assets/events).
type AssetEvent struct {
	// Asset is the asset's name (Airflow's asset name, Asset(name=...)); the client resolves
	// its id once (GET /api/v2/assets?name_pattern=...) and caches it. Required.
	Asset string
	// KafkatxID is the event's kafkatx id, sent in extra under KafkatxIDKey. Required.
	KafkatxID string
	// Extra is the rest of the event's extra, marshalled to a JSON object (nil: {}); its own
	// KafkatxIDKey, if any, is replaced.
	Extra any
	// MaybeSentSince, when not zero, says an earlier try may have posted this event (a
	// process that crashed after the POST, a transaction that failed after it: MarkAssetPending
	// returns when): the client first reads the asset's events back from it (minus
	// AssetSettleMargin) and posts only when none carries KafkatxID.
	MaybeSentSince time.Time
}

// AssetResult is the outcome of a successful CreateAssetEvent.
type AssetResult struct {
	AssetID int64
	// EventID is the asset event's id in Airflow.
	EventID int64
	// Timestamp is the event's timestamp in Airflow.
	Timestamp time.Time
	// Created is true when this call created the event (Settled included); false when the
	// read-back before posting found it (an earlier try created it).
	Created bool
	// Settled is true when a create got no answer or a 5xx and a read-back found the event.
	Settled bool
	// Attempts is the number of creates sent.
	Attempts int
}

// AssetEventInfo is what the client reads of an asset event.
type AssetEventInfo struct {
	ID        int64           `json:"id"`
	AssetID   int64           `json:"asset_id"`
	Name      string          `json:"name"`
	Extra     json.RawMessage `json:"extra"`
	Timestamp time.Time       `json:"timestamp"`
}

// KafkatxID returns the event's extra's KafkatxIDKey ("" when none).
func (e AssetEventInfo) KafkatxID() string {
	var x map[string]json.RawMessage
	if json.Unmarshal(e.Extra, &x) != nil {
		return ""
	}
	var id string
	_ = json.Unmarshal(x[KafkatxIDKey], &id)
	return id
}

// assetCache returns the client's asset ids by name.
func (c *Client) assetCache() *sync.Map { return &c.assets }

// AssetID returns the id of the asset named name, cached after the first read. An asset
// Airflow does not know (not parsed yet, deleted, renamed) is an *UnavailableError wrapping a
// 404 *StatusError: a kafkatx handler returning it makes its partition wait, as for a DAG not
// parsed yet; it never dead-letters. Other errors as TriggerDAGRun's.
func (c *Client) AssetID(ctx context.Context, name string) (int64, error) {
	if name == "" {
		return 0, errors.New("airflow: the asset name is empty")
	}
	cache := c.assetCache()
	if id, ok := cache.Load(name); ok {
		return id.(int64), nil
	}
	for offset := 0; ; offset += PageSize {
		u := c.base.JoinPath("api", "v2", "assets")
		u.RawQuery = url.Values{"name_pattern": {name}, "limit": {strconv.Itoa(PageSize)}, "offset": {strconv.Itoa(offset)}}.Encode()
		var page struct {
			Assets []struct {
				ID   int64  `json:"id"`
				Name string `json:"name"`
			} `json:"assets"`
		}
		if _, err := c.get(ctx, u, &page, false); err != nil {
			return 0, err
		}
		for _, a := range page.Assets { // name_pattern matches substrings: the exact name only
			if a.Name == name {
				cache.Store(name, a.ID)
				return a.ID, nil
			}
		}
		if len(page.Assets) < PageSize {
			return 0, &UnavailableError{Err: &StatusError{StatusCode: http.StatusNotFound, Endpoint: "GET /api/v2/assets",
				Detail: fmt.Sprintf("Airflow has no asset named %q (not parsed yet, deleted or renamed)", name)}}
		}
	}
}

// forgetAsset drops a cached asset id (the asset was deleted or re-created under a new id).
func (c *Client) forgetAsset(name string) { c.assetCache().Delete(name) }

// AssetEvents pages through the events of asset id assetID whose timestamp is at or after
// since (zero: all), oldest first (order_by=timestamp: Airflow 3.3 refuses order_by=id;
// PageSize a page), calling each for every event
// until each returns false. Errors as TriggerDAGRun's.
func (c *Client) AssetEvents(ctx context.Context, assetID int64, since time.Time, each func(AssetEventInfo) bool) error {
	for offset := 0; ; offset += PageSize {
		u := c.base.JoinPath("api", "v2", "assets", "events")
		q := url.Values{"asset_id": {strconv.FormatInt(assetID, 10)}, "limit": {strconv.Itoa(PageSize)}, "offset": {strconv.Itoa(offset)}, "order_by": {"timestamp"}}
		if !since.IsZero() {
			q.Set("timestamp_gte", timeParam(since))
		}
		u.RawQuery = q.Encode()
		var page struct {
			Events []AssetEventInfo `json:"asset_events"`
		}
		if _, err := c.get(ctx, u, &page, false); err != nil {
			return err
		}
		for _, e := range page.Events {
			if !each(e) {
				return nil
			}
		}
		if len(page.Events) < PageSize {
			return nil
		}
	}
}

// findAssetEvent reads assetID's events from since back and returns the one whose extra
// carries kafkatxID.
func (c *Client) findAssetEvent(ctx context.Context, assetID int64, since time.Time, kafkatxID string) (AssetEventInfo, bool, error) {
	var found AssetEventInfo
	ok := false
	err := c.AssetEvents(ctx, assetID, since, func(e AssetEventInfo) bool {
		if e.KafkatxID() == kafkatxID {
			found, ok = e, true
			return false
		}
		return true
	})
	return found, ok, err
}

// CreateAssetEvent creates one asset event on e.Asset with extra {KafkatxIDKey: e.KafkatxID,
// ...e.Extra}, exactly once per kafkatx id as long as every try of an event passes the
// earlier try's time in e.MaybeSentSince (MarkAssetPending): Airflow keeps no key of its own
// for asset events, so a create that may have reached Airflow — a try before a crash, or a
// POST that got no answer or a 5xx — is settled by reading the asset's events back
// (GET /api/v2/assets/events?asset_id=…&timestamp_gte=…, matching extra.kafkatx_id), never by
// a blind second POST. Found before posting: Created false; found after a lost answer:
// Created and Settled. Errors:
//   - an *UnavailableError (the partition waits, no attempt spent) when Airflow failed: no
//     asset of that name (404: not parsed yet, deleted or renamed; never dead-lettered),
//     refused credentials, Airflow down or answering 5xx after the retries;
//   - a plain *StatusError for any other answer (400, 422: Airflow refuses the event);
//   - the context's error when ctx ends.
func (c *Client) CreateAssetEvent(ctx context.Context, e AssetEvent) (AssetResult, error) {
	if e.KafkatxID == "" {
		return AssetResult{}, errors.New("airflow: AssetEvent.KafkatxID is required")
	}
	extra := map[string]any{}
	if e.Extra != nil {
		b, err := json.Marshal(e.Extra)
		if err != nil {
			return AssetResult{}, fmt.Errorf("airflow: encode extra: %w", err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil || m == nil {
			return AssetResult{}, errors.New("airflow: AssetEvent.Extra must marshal to a JSON object")
		}
		for k, v := range m {
			extra[k] = v
		}
	}
	extra[KafkatxIDKey] = e.KafkatxID
	assetID, err := c.AssetID(ctx, e.Asset)
	if err != nil {
		return AssetResult{}, err
	}
	if !e.MaybeSentSince.IsZero() {
		ev, ok, err := c.findAssetEvent(ctx, assetID, e.MaybeSentSince.Add(-AssetSettleMargin), e.KafkatxID)
		if err != nil {
			// Airflow's answer, not the event, is at fault: wait (never post blindly, never
			// dead-letter an event because its settling read failed).
			return AssetResult{AssetID: assetID}, &UnavailableError{Err: fmt.Errorf("airflow: settle asset event %s on %s by reading the asset's events back: %w", e.KafkatxID, e.Asset, err)}
		}
		if ok {
			c.log.Info("asset event found before posting: an earlier try created it", zap.String("asset", e.Asset), zap.String("kafkatx_id", e.KafkatxID), zap.Int64("event_id", ev.ID))
			return AssetResult{AssetID: assetID, EventID: ev.ID, Timestamp: ev.Timestamp}, nil
		}
	}
	body, err := json.Marshal(map[string]any{"asset_id": assetID, "extra": extra})
	if err != nil {
		return AssetResult{}, fmt.Errorf("airflow: encode request: %w", err)
	}
	endpoint := c.base.JoinPath("api", "v2", "assets", "events")
	res := AssetResult{AssetID: assetID}
	bo := &backoff.ExponentialBackOff{InitialInterval: c.cfg.InitialBackoff, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: c.cfg.MaxBackoff}
	var posted AssetEventInfo
	_, err = backoff.Retry(ctx, func() (bool, error) {
		start := time.Now()
		res.Attempts++
		got, err := c.postAssetEvent(ctx, endpoint, body)
		if err == nil {
			posted = got
			return true, nil
		}
		if mayHaveArrived(err) && ctx.Err() == nil {
			ev, ok, rerr := c.findAssetEvent(ctx, assetID, start.Add(-AssetSettleMargin), e.KafkatxID)
			if rerr == nil && ok {
				posted, res.Settled = ev, true
				c.log.Info("create asset event: the POST got an error or no answer but the event exists; settled by its kafkatx_id",
					zap.String("asset", e.Asset), zap.String("kafkatx_id", e.KafkatxID), zap.String("create_error", err.Error()))
				return true, nil
			}
			if rerr != nil {
				// Not known whether the POST arrived: never post again blindly. The caller's
				// next try (with the pending mark's time) reads back again.
				return false, backoff.Permanent(&UnavailableError{Err: fmt.Errorf("%w; reading the asset's events back to settle it failed: %w", err, rerr)})
			}
		}
		return false, err
	},
		backoff.WithBackOff(bo),
		backoff.WithMaxTries(uint(c.cfg.MaxAttempts)),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			c.log.Warn("create asset event: HTTP request failed; retrying", zap.String("asset", e.Asset), zap.String("kafkatx_id", e.KafkatxID),
				zap.Int("attempt", res.Attempts), zap.Duration("backoff", d), zap.Error(err))
		}))
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
			return res, err
		}
		var se *StatusError
		if errors.As(err, &se) && se.StatusCode == http.StatusNotFound {
			c.forgetAsset(e.Asset) // deleted, or re-created under another id: resolve again
		}
		err = fmt.Errorf("airflow: create asset event %s on %s: %w", e.KafkatxID, e.Asset, err)
		if unavailable(err) {
			err = &UnavailableError{Err: err}
		}
		return res, err
	}
	res.Created, res.EventID, res.Timestamp = true, posted.ID, posted.Timestamp
	return res, nil
}

// postAssetEvent sends one POST of an asset event and decodes the created event; a 401 or 403
// with renewable credentials is followed by one more request with fresh ones. Errors as
// postRun's.
func (c *Client) postAssetEvent(ctx context.Context, endpoint *url.URL, body []byte) (AssetEventInfo, error) {
	for renewed := false; ; renewed = true {
		token, err := c.bearer(ctx, renewed)
		if err != nil {
			if ctx.Err() != nil {
				return AssetEventInfo{}, backoff.Permanent(context.Cause(ctx))
			}
			return AssetEventInfo{}, backoff.Permanent(err)
		}
		status, head, hdr, err := c.roundTrip(ctx, http.MethodPost, endpoint.String(), body, token, 1<<20, false)
		if err != nil {
			if ctx.Err() != nil {
				return AssetEventInfo{}, backoff.Permanent(context.Cause(ctx))
			}
			return AssetEventInfo{}, err
		}
		if status >= 200 && status < 300 {
			var ev AssetEventInfo
			_ = json.Unmarshal(head, &ev) // the id is for the ledger; the event exists either way
			return ev, nil
		}
		detail := string(bytes.ToValidUTF8(head[:min(len(head), 512)], []byte("?")))
		se := &StatusError{StatusCode: status, Detail: detail, Endpoint: "/api/v2/assets/events"}
		if se.Auth() && !renewed && c.renewable() {
			continue
		}
		if !se.Temporary() {
			return AssetEventInfo{}, backoff.Permanent(se)
		}
		if d, ok := retryAfter(hdr.Get("Retry-After")); ok {
			se.retryAfter = &backoff.RetryAfterError{Duration: min(d, c.cfg.MaxBackoff)}
		}
		return AssetEventInfo{}, se
	}
}
