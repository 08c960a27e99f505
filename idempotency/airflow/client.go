// Package airflow starts Apache Airflow DAG runs through Airflow 3's stable REST API v2
// (POST /api/v2/dags/{dag_id}/dagRuns) with a dag_run_id derived from an idempotency key, so
// that starting the run for one key twice is a no-op: Airflow refuses the second create with
// 409 Conflict, which this client reports as success (Result.Created == false).
//
// Requests carry JSON with a Content-Length (never a chunked body) and a bearer token only
// when one is configured. Each attempt has a timeout; failed attempts that may succeed later
// (network errors, 408, 425, 429, 5xx) are retried a bounded number of times with
// exponential backoff and jitter (github.com/cenkalti/backoff/v5), honouring Retry-After.
package airflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
)

// Config configures a Client.
type Config struct {
	// BaseURL is the Airflow API server's base URL, for example http://airflow:8080; the
	// client appends /api/v2/dags/{dag_id}/dagRuns. Required.
	BaseURL string

	// Token is a bearer token sent as "Authorization: Bearer <token>" (for example read from
	// an environment variable by the caller). Defaults to none.
	Token string

	// TokenFile is a file holding the bearer token, re-read before every request so a
	// rotated token (Airflow 3 issues JWTs that expire) is picked up; surrounding white
	// space is ignored. It takes precedence over Token. With neither, no Authorization
	// header is sent. Defaults to none.
	TokenFile string

	// HTTPClient sends the requests. Defaults to a client with RequestTimeout as its
	// timeout.
	HTTPClient *http.Client

	// RequestTimeout bounds one attempt (connect, send, read the answer). Defaults to 10s.
	RequestTimeout time.Duration

	// MaxAttempts is the most attempts per trigger, the first included. Defaults to 5.
	MaxAttempts int

	// InitialBackoff is the wait before the second attempt; it grows 2× per attempt with
	// ±20% jitter up to MaxBackoff. Defaults to 200ms.
	InitialBackoff time.Duration

	// MaxBackoff caps the wait between attempts, Retry-After included. Defaults to 5s.
	MaxBackoff time.Duration

	// RunIDPrefix starts the run ids derived by RunID. Defaults to DefaultRunIDPrefix.
	RunIDPrefix string

	// Logger receives retry logs, named "kafkatx.airflow". Tokens and conf are never
	// logged. Defaults to zap.NewNop().
	Logger *zap.Logger
}

// Client triggers DAG runs. Create one with New; it is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	http *http.Client
	log  *zap.Logger
}

// New validates cfg and returns a Client. It sends nothing.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("airflow: Config.BaseURL is required")
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("airflow: Config.BaseURL %q is not an http(s) URL", cfg.BaseURL)
	}
	if u.User != nil {
		return nil, errors.New("airflow: Config.BaseURL must not carry credentials; use Token or TokenFile")
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: cfg.RequestTimeout}
	}
	return &Client{cfg: cfg, base: u, http: hc, log: cfg.Logger.Named("kafkatx.airflow")}, nil
}

// Trigger describes one DAG run to start.
type Trigger struct {
	// DAGID is the DAG to run. Required.
	DAGID string
	// Key is the idempotency key the run id is derived from (RunID). Required unless RunID
	// is set.
	Key string
	// RunID overrides the derived run id. It must be deterministic for the unit of work, or
	// retries start new runs.
	RunID string
	// Conf is the run's conf, marshalled to a JSON object; nil sends {}.
	Conf any
	// LogicalDate is the run's logical date. Defaults to nil, sent as JSON null: Airflow 3
	// then sets none, and no (dag_id, logical_date) uniqueness can make a different run
	// answer 409. Setting it risks exactly that: two events with one logical date would
	// look like one run.
	LogicalDate *time.Time
	// Note is the run's note. Defaults to none.
	Note string
}

// Result is the outcome of a successful Trigger.
type Result struct {
	// RunID is the dag_run_id posted.
	RunID string
	// Created is true when this call created the run, false when Airflow answered 409
	// Conflict because a run with this id already exists (an earlier attempt created it).
	Created bool
	// Attempts is the number of requests sent.
	Attempts int
}

// StatusError is an answer from Airflow that is neither success nor 409.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Detail is the start of the answer's body (at most 512 bytes, valid UTF-8).
	Detail string

	retryAfter *backoff.RetryAfterError
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("airflow answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Detail)
}

// Unwrap exposes a Retry-After delay to the backoff loop.
func (e *StatusError) Unwrap() error {
	if e.retryAfter == nil {
		return nil
	}
	return e.retryAfter
}

// Temporary reports whether a later attempt may succeed: 408, 425, 429 and 5xx.
func (e *StatusError) Temporary() bool {
	switch e.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return e.StatusCode >= 500
}

type postBody struct {
	DAGRunID    string     `json:"dag_run_id"`
	LogicalDate *time.Time `json:"logical_date"`
	Conf        any        `json:"conf"`
	Note        string     `json:"note,omitempty"`
}

// TriggerDAGRun starts the run described by t, or finds it already started. It returns a
// *StatusError for an answer other than success or 409 (after the retries, for a temporary
// one), the context's error when ctx ends, or the last network error.
func (c *Client) TriggerDAGRun(ctx context.Context, t Trigger) (Result, error) {
	if t.DAGID == "" {
		return Result{}, errors.New("airflow: Trigger.DAGID is required")
	}
	runID := t.RunID
	if runID == "" {
		if t.Key == "" {
			return Result{}, errors.New("airflow: Trigger needs a Key or a RunID")
		}
		runID = RunID(c.cfg.RunIDPrefix, t.Key)
	}
	conf := t.Conf
	if conf == nil {
		conf = map[string]any{}
	}
	confJSON, err := json.Marshal(conf)
	if err != nil {
		return Result{}, fmt.Errorf("airflow: encode conf: %w", err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(confJSON), []byte("{")) {
		return Result{}, errors.New("airflow: Trigger.Conf must marshal to a JSON object")
	}
	body, err := json.Marshal(postBody{DAGRunID: runID, LogicalDate: t.LogicalDate, Conf: json.RawMessage(confJSON), Note: t.Note})
	if err != nil {
		return Result{}, fmt.Errorf("airflow: encode request: %w", err)
	}
	endpoint := c.base.JoinPath("api", "v2", "dags", t.DAGID, "dagRuns").String()
	attempts := 0
	bo := &backoff.ExponentialBackOff{InitialInterval: c.cfg.InitialBackoff, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: c.cfg.MaxBackoff}
	created, err := backoff.Retry(ctx, func() (bool, error) {
		attempts++
		return c.post(ctx, endpoint, body)
	},
		backoff.WithBackOff(bo),
		backoff.WithMaxTries(uint(c.cfg.MaxAttempts)),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			c.log.Warn("trigger DAG run: retrying", zap.String("dag_id", t.DAGID), zap.String("run_id", runID),
				zap.Int("attempt", attempts), zap.Duration("backoff", d), zap.Error(err))
		}))
	if err != nil {
		return Result{RunID: runID, Attempts: attempts}, fmt.Errorf("airflow: trigger %s run %s: %w", t.DAGID, runID, err)
	}
	return Result{RunID: runID, Created: created, Attempts: attempts}, nil
}

// post sends one attempt; it reports created, or a permanent or retryable error.
func (c *Client) post(ctx context.Context, endpoint string, body []byte) (bool, error) {
	token, err := c.token()
	if err != nil {
		return false, err // retryable: the file may be mid-rotation
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return false, backoff.Permanent(err)
	}
	req.ContentLength = int64(len(body)) // set by NewRequest for a *bytes.Reader; explicit: never chunked
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kafkatx-airflow/1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return false, backoff.Permanent(context.Cause(ctx))
		}
		return false, err
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return true, nil
	case resp.StatusCode == http.StatusConflict:
		return false, nil
	}
	se := &StatusError{StatusCode: resp.StatusCode, Detail: strings.ToValidUTF8(string(head), "?")}
	if !se.Temporary() && !(resp.StatusCode == http.StatusUnauthorized && c.cfg.TokenFile != "") {
		return false, backoff.Permanent(se)
	}
	if d, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
		se.retryAfter = &backoff.RetryAfterError{Duration: min(d, c.cfg.MaxBackoff)}
	}
	return false, se
}

func (c *Client) token() (string, error) {
	if c.cfg.TokenFile == "" {
		return c.cfg.Token, nil
	}
	b, err := os.ReadFile(c.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", c.cfg.TokenFile)
	}
	return t, nil
}

// retryAfter parses a Retry-After value (RFC 9110 §10.2.3): delay-seconds or an HTTP date.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}
