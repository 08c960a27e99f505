// Package airflow starts Apache Airflow DAG runs through Airflow 3's stable REST API v2
// (POST /api/v2/dags/{dag_id}/dagRuns) with a dag_run_id derived from an idempotency key, so
// that starting the run for one key twice is a no-op: Airflow refuses the second create with
// 409 Conflict, which this client reports as success (Result.Created == false).
//
// Requests carry JSON with a Content-Length (never a chunked body) and a bearer token when
// one is configured: a fixed Token, a TokenFile re-read before every request and after a 401,
// or a Username and PasswordFile exchanged at Airflow's POST /auth/token and refreshed before
// the token expires. Each attempt has a timeout; failed attempts that may succeed soon
// (network errors, 408, 425, 429, 5xx) are retried a bounded number of times with
// exponential backoff and jitter (github.com/cenkalti/backoff/v5), honouring Retry-After.
//
// Failures of Airflow rather than of the request — refused or expired credentials (401, 403),
// a DAG Airflow does not know (404: not parsed yet), Airflow down or failing (network errors,
// timeouts, 5xx after the retries) — are returned as an *UnavailableError, which
// kafkatx.IsUnavailable recognises (its method Unavailable reports true), so a kafkatx handler
// that returns them makes its partition wait and retry without spending the event's attempts
// (kafkatx.UnavailableError). Other answers (400, 422: Airflow refuses this run) are plain
// *StatusError values. The package does not import kafkatx.
//
// Every request holds a permit of one limit on the requests in flight to Airflow over the
// whole Client (Config.Limiter, adaptive by default: package limit), taken before the
// request's timeout starts; a create that got no answer (a timeout, a connection lost after
// the request went out) or a 5xx is settled by reading the run by its id before it is sent
// again.
package airflow

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/limit"
)

// Config configures a Client.
type Config struct {
	// BaseURL is the Airflow API server's base URL, for example http://airflow:8080; the
	// client appends /api/v2/dags/{dag_id}/dagRuns (and /auth/token). Required.
	BaseURL string

	// Token is a bearer token sent as "Authorization: Bearer <token>" (for example read from
	// an environment variable by the caller). Defaults to none.
	Token string

	// TokenFile is a file holding the bearer token, re-read before every request and once more
	// after a 401 or 403, so a rotated token (Airflow 3 issues JWTs that expire, 24 h by
	// default) is picked up; surrounding white space is ignored. It takes precedence over
	// Token. Defaults to none.
	TokenFile string

	// Username and PasswordFile make the client obtain its own tokens: it posts
	// {"username", "password"} to BaseURL + /auth/token (Airflow 3's SimpleAuthManager and
	// FAB auth manager answer with {"access_token": JWT}), with the password read from
	// PasswordFile at every exchange, and exchanges again once 80% of the token's lifetime
	// (its JWT iat and exp claims) has passed, at the latest a minute before it expires, and
	// after a 401 or 403. Both or neither; they exclude Token and TokenFile. With no
	// credentials at all no Authorization header is sent.
	Username, PasswordFile string

	// HTTPClient sends the requests. Defaults to a client with RequestTimeout as its
	// timeout.
	HTTPClient *http.Client

	// RequestTimeout bounds one attempt (connect, send, read the answer), from when it holds
	// its permit of Limiter: time waiting for the permit does not count. Defaults to 10s.
	RequestTimeout time.Duration

	// MaxAttempts is the most attempts per trigger for temporary failures, the first
	// included. Defaults to 5.
	MaxAttempts int

	// InitialBackoff is the wait before the second attempt; it grows 2× per attempt with
	// ±20% jitter up to MaxBackoff. Defaults to 200ms.
	InitialBackoff time.Duration

	// MaxBackoff caps the wait between attempts, Retry-After included. Defaults to 5s.
	MaxBackoff time.Duration

	// MaxConfBytes is the largest conf, in bytes of JSON, a trigger sends: a larger one is
	// refused before sending with a *ConfTooLargeError (the run is not created; retrying
	// cannot help, so a kafkatx handler dead-letters it with the size and the limit). Airflow
	// itself sets no limit, but what stands in front of it or stores the run often does
	// (nginx's client_max_body_size is 1 MiB by default; apache/airflow#66779: a large conf
	// answered 413 or an opaque 500). Defaults to DefaultMaxConfBytes; negative: no limit.
	MaxConfBytes int

	// RunIDPrefix starts the run ids derived by RunID; it must pass ValidateRunIDPrefix.
	// Defaults to DefaultRunIDPrefix.
	RunIDPrefix string

	// Logger receives retry logs, named "kafkatx.airflow". Tokens, passwords and conf are
	// never logged. Defaults to zap.NewNop().
	Logger *zap.Logger

	// Limiter bounds the requests in flight to Airflow — creates, the reads that settle them
	// and token exchanges — over every caller of this Client (package limit: a limit that
	// adapts to Airflow's latency and errors). A request waits for a permit before its
	// RequestTimeout starts, so time queued in the client never counts against it. Each
	// answer feeds the limit: 429, a 408 or 5xx with Retry-After, a refused or reset
	// connection as limit.Overloaded (the limit shrinks); a timeout, 408 or 5xx as
	// limit.Dropped for the trigger's key — the key named on TriggerDAGRun's context
	// (limit.WithKey: a dagtrigger names the Kafka record key, the row), else the Trigger's Key
	// (its RunID without one) — which shrinks the limit unless that key was refused before
	// with no success since (one key's refusals do not slow every key; package limit); any
	// other answer as a latency sample. Defaults to
	// limit.New(limit.Config{}) (4 at the start, 1 to 256, docs/dag-triggered-services.md):
	// one api-server worker of a default Airflow 3.3.2 (SQLAlchemy pool 5 + 10 overflow)
	// locked up under 96 creates in flight. limit.Fixed(n) holds n.
	Limiter *limit.Limiter

	// DAGState configures the read of a DAG's is_paused before its creates, cached per DAG
	// (dagstate.go): a paused DAG is reported, and posted to or held (DAGStateConfig).
	// Defaults: read every 30 s, runs posted to a paused DAG.
	DAGState DAGStateConfig
}

// Client triggers DAG runs. Create one with New; it is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	http *http.Client
	log  *zap.Logger
	dags *dagStates // the DAGs' is_paused, cached

	mu        sync.Mutex // guards the exchanged token
	token     string
	expires   time.Time // zero: no exp claim
	refreshAt time.Time

	assets sync.Map // asset ids by name (asset.go: AssetID)
}

// New validates cfg and returns a Client. It sends nothing.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("airflow: Config.BaseURL is required")
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Not quoted: a URL that does not parse may hold credentials.
		return nil, errors.New("airflow: Config.BaseURL is not an http(s) URL (http://host:port)")
	}
	if u.User != nil {
		return nil, errors.New("airflow: Config.BaseURL must not carry credentials; use Token, TokenFile or Username and PasswordFile")
	}
	if (cfg.Username == "") != (cfg.PasswordFile == "") {
		return nil, errors.New("airflow: Config.Username and Config.PasswordFile go together")
	}
	if cfg.Username != "" && (cfg.Token != "" || cfg.TokenFile != "") {
		return nil, errors.New("airflow: Config.Username and PasswordFile exclude Token and TokenFile")
	}
	if cfg.RunIDPrefix != "" {
		if err := ValidateRunIDPrefix(cfg.RunIDPrefix); err != nil {
			return nil, fmt.Errorf("Config.RunIDPrefix: %w", err)
		}
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
	if cfg.MaxConfBytes == 0 {
		cfg.MaxConfBytes = DefaultMaxConfBytes
	}
	if cfg.Limiter == nil {
		cfg.Limiter = limit.MustNew(limit.Config{})
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: cfg.RequestTimeout}
	}
	c := &Client{cfg: cfg, base: u, http: hc, log: cfg.Logger.Named("kafkatx.airflow")}
	if c.dags, err = newDAGStates(c, cfg.DAGState); err != nil {
		return nil, err
	}
	return c, nil
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
	// Settled is true when a create answered 5xx, or got no answer (a timeout, a connection
	// lost after the request went out), and a read of the run by its id found it (the run was
	// created before the answer failed): Created is then true, and no other create is sent.
	Settled bool
	// Paused is true when the client read the DAG as paused before posting
	// (DAGStateConfig.WhenPaused PausedPost): the run stays queued until it is unpaused.
	Paused bool
}

// StatusError is an answer from Airflow that is neither success nor 409.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Detail is the start of the answer's body (at most 512 bytes, valid UTF-8).
	Detail string
	// Endpoint is the path requested (/api/v2/dags/…/dagRuns or /auth/token).
	Endpoint string

	retryAfter *backoff.RetryAfterError
}

func (e *StatusError) Error() string {
	method := "POST " // Endpoint names its method when it is not a POST ("GET /api/v2/...", "PATCH ...")
	for _, m := range []string{"GET ", "PATCH ", "DELETE ", "PUT "} {
		if strings.HasPrefix(e.Endpoint, m) {
			method = ""
		}
	}
	return fmt.Sprintf("airflow answered %d %s to %s%s: %s", e.StatusCode, http.StatusText(e.StatusCode), method, e.Endpoint, e.Detail)
}

// Unwrap exposes a Retry-After delay to the backoff loop.
func (e *StatusError) Unwrap() error {
	if e.retryAfter == nil {
		return nil
	}
	return e.retryAfter
}

// Temporary reports whether a later attempt may succeed soon: 408, 425, 429 and 5xx.
func (e *StatusError) Temporary() bool {
	switch e.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return e.StatusCode >= 500
}

// Auth reports whether Airflow refused the credentials: 401 (missing, invalid or expired
// token, or a wrong password at /auth/token) or 403.
func (e *StatusError) Auth() bool {
	return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden
}

// unavailable reports whether the answer is a failure of Airflow rather than of the request
// (see the package documentation).
func (e *StatusError) unavailable() bool {
	return e.Auth() || e.StatusCode == http.StatusNotFound || e.Temporary()
}

type postBody struct {
	DAGRunID    string     `json:"dag_run_id"`
	LogicalDate *time.Time `json:"logical_date"`
	Conf        any        `json:"conf"`
	Note        string     `json:"note,omitempty"`
}

// TriggerDAGRun starts the run described by t, or finds it already started. Errors:
//   - an *UnavailableError (IsUnavailable and kafkatx.IsUnavailable report true) when
//     Airflow, not the request, failed: a *StatusError for 401, 403 or 404, or for 408, 425, 429 or 5xx
//     after the retries; the last network error (refused connection, timeout) after the
//     retries; an unreadable token or password file; a failed token exchange;
//   - a plain *StatusError for any other answer (400, 422: Airflow refuses this run);
//   - an *UnavailableError wrapping a *PausedError when the DAG is read as paused and
//     DAGStateConfig.WhenPaused is PausedHold (nothing is posted);
//   - the context's error when ctx ends.
func (c *Client) TriggerDAGRun(ctx context.Context, t Trigger) (Result, error) {
	if t.DAGID == "" {
		return Result{}, errors.New("airflow: Trigger.DAGID is required")
	}
	if err := ValidateDAGID(t.DAGID); err != nil {
		return Result{}, err
	}
	runID := t.RunID
	if runID != "" {
		if err := validRunIDSegment(runID); err != nil {
			return Result{}, err
		}
	}
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
	if c.cfg.MaxConfBytes > 0 && len(confJSON) > c.cfg.MaxConfBytes {
		return Result{RunID: runID}, &ConfTooLargeError{DAGID: t.DAGID, RunID: runID, Size: len(confJSON), Limit: c.cfg.MaxConfBytes}
	}
	body, err := json.Marshal(postBody{DAGRunID: runID, LogicalDate: t.LogicalDate, Conf: json.RawMessage(confJSON), Note: t.Note})
	if err != nil {
		return Result{}, fmt.Errorf("airflow: encode request: %w", err)
	}
	paused, err := c.dags.before(ctx, t.DAGID)
	if err != nil {
		return Result{RunID: runID}, err
	}
	// The ids as escaped path segments: JoinPath takes escaped text and resolves ".." (both
	// ids are checked above).
	endpoint := c.base.JoinPath("api", "v2", "dags", url.PathEscape(t.DAGID), "dagRuns")
	if !limit.HasKey(ctx) {
		// The requests are this run's: a 5xx for it alone, retried, is its own (Config.Limiter).
		key := t.Key
		if key == "" {
			key = runID
		}
		ctx = limit.WithKey(ctx, []byte(key))
	}
	attempts := 0
	st := &settler{c: c, run: endpoint.JoinPath(url.PathEscape(runID))}
	bo := &backoff.ExponentialBackOff{InitialInterval: c.cfg.InitialBackoff, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: c.cfg.MaxBackoff}
	created, err := backoff.Retry(ctx, func() (bool, error) {
		attempts++
		created, err := c.postRun(ctx, endpoint, body)
		if err != nil && st.settles(ctx, err) {
			return true, nil
		}
		return created, err
	},
		backoff.WithBackOff(bo),
		backoff.WithMaxTries(uint(c.cfg.MaxAttempts)),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, d time.Duration) {
			c.log.Warn("trigger DAG run: HTTP request failed; retrying", zap.String("dag_id", t.DAGID), zap.String("run_id", runID),
				zap.Int("attempt", attempts), zap.Duration("backoff", d), zap.Error(err))
		}))
	c.dags.after(t.DAGID, paused, err)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
			return Result{RunID: runID, Attempts: attempts}, err
		}
		if tl := st.tooLarge(err, t.DAGID, runID, len(confJSON)); tl != nil {
			return Result{RunID: runID, Attempts: attempts}, tl
		}
		err = fmt.Errorf("airflow: trigger %s run %s: %w", t.DAGID, runID, err)
		if unavailable(err) {
			err = &UnavailableError{Err: err}
		}
		return Result{RunID: runID, Attempts: attempts}, err
	}
	return Result{RunID: runID, Created: created, Attempts: attempts, Settled: st.settled, Paused: paused}, nil
}

// UnavailableError is a failure of Airflow rather than of the request (see TriggerDAGRun):
// refused credentials, a DAG Airflow does not know, Airflow down or failing. Err is the
// *StatusError, network or credential error. Its Unavailable method makes kafkatx's loop wait
// and retry the message without counting an attempt (kafkatx.IsUnavailable).
type UnavailableError struct {
	Err error
}

func (e *UnavailableError) Error() string     { return "airflow unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error     { return e.Err }
func (e *UnavailableError) Unavailable() bool { return true }

// WaitUnbounded reports whether Airflow answered 404 — a DAG or an asset it does not know: not
// parsed yet, or deleted — so that kafkatx's loop waits without Config.UnavailableMaxWait's
// bound (engine.WaitsUnbounded): an event for a DAG parsed late is never dead-lettered for it.
func (e *UnavailableError) WaitUnbounded() bool {
	var se *StatusError
	return errors.As(e.Err, &se) && se.StatusCode == http.StatusNotFound
}

// IsUnavailable reports whether err or an error it wraps is an *UnavailableError.
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}

// unavailable classifies the error a trigger ended with (see TriggerDAGRun).
func unavailable(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.unavailable()
	}
	var ce *credentialError
	var ue *url.Error
	return errors.As(err, &ce) || errors.As(err, &ue)
}

// credentialError is a token or password file that could not be read, or a token exchange
// that failed for a reason other than Airflow's answer.
type credentialError struct{ err error }

func (e *credentialError) Error() string { return e.err.Error() }
func (e *credentialError) Unwrap() error { return e.err }

// postRun sends one attempt; it reports created, or a permanent or retryable error. A 401 or
// 403 with renewable credentials (a token file, or username and password) is followed by
// one more request with fresh credentials.
func (c *Client) postRun(ctx context.Context, endpoint *url.URL, body []byte) (bool, error) {
	for renewed := false; ; renewed = true {
		token, err := c.bearer(ctx, renewed)
		if err != nil {
			if ctx.Err() != nil {
				return false, backoff.Permanent(context.Cause(ctx))
			}
			return false, backoff.Permanent(err)
		}
		status, head, hdr, err := c.send(ctx, endpoint, body, token)
		if err != nil {
			return false, err
		}
		switch {
		case status >= 200 && status < 300:
			return true, nil
		case status == http.StatusConflict:
			return false, nil
		}
		se := &StatusError{StatusCode: status, Detail: head, Endpoint: "/" + strings.TrimLeft(endpoint.Path, "/")}
		if se.Auth() && !renewed && c.renewable() {
			c.log.Info("Airflow refused the token; renewing it", zap.Int("status", status), zap.String("detail", head))
			continue
		}
		if !se.Temporary() {
			return false, backoff.Permanent(se)
		}
		if d, ok := retryAfter(hdr.Get("Retry-After")); ok {
			se.retryAfter = &backoff.RetryAfterError{Duration: min(d, c.cfg.MaxBackoff)}
		}
		return false, se
	}
}

// send posts body as JSON to endpoint once and returns the status, the start of the body and
// the headers; err is a network error (retryable) or the context's (permanent).
func (c *Client) send(ctx context.Context, endpoint *url.URL, body []byte, token string) (int, string, http.Header, error) {
	status, head, hdr, err := c.roundTrip(ctx, http.MethodPost, endpoint.String(), body, token, 512, false)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", nil, backoff.Permanent(context.Cause(ctx))
		}
		return 0, "", nil, err
	}
	return status, strings.ToValidUTF8(string(head), "?"), hdr, nil
}

// roundTrip sends one request under a permit of the client's Limiter and returns the status,
// up to keep bytes of the body and the headers. The permit is taken before the request's
// RequestTimeout starts: time waiting for it is not the request's. The answer feeds the
// limit (Config.Limiter), for ctx's key (limit.WithKey); settling marks the read that settles
// a create: its success is a latency sample that does not count as the key's recovery (its
// creates were refused, not its reads). err is a network error, the context's, or a request
// that could not be built (permanent).
func (c *Client) roundTrip(ctx context.Context, method, u string, body []byte, token string, keep int64, settling bool) (int, []byte, http.Header, error) {
	permit, err := c.cfg.Limiter.Acquire(ctx)
	if err != nil {
		return 0, nil, nil, err
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, method, u, rd)
	if err != nil {
		permit.Done(limit.Ignored)
		return 0, nil, nil, backoff.Permanent(err)
	}
	if body != nil {
		req.ContentLength = int64(len(body)) // set by NewRequest for a *bytes.Reader; explicit: never chunked
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kafkatx-airflow/1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			permit.Done(limit.Ignored)
		case errors.As(err, &ne) && ne.Timeout():
			permit.Done(limit.Dropped) // slow for this call: may be its key's alone (a lock)
		default:
			permit.Done(limit.Overloaded) // refused or reset: Airflow's, whatever the key
		}
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, keep))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests, (code == http.StatusRequestTimeout || code >= 500) && resp.Header.Get("Retry-After") != "":
		permit.Done(limit.Overloaded) // Airflow says it is overloaded for everyone
	case code == http.StatusRequestTimeout, code >= 500:
		permit.Done(limit.Dropped)
	case settling:
		permit.DoneKey(limit.Success, nil)
	default:
		permit.Done(limit.Success)
	}
	return resp.StatusCode, head, resp.Header, nil
}

// renewable reports whether new credentials can come without a restart.
func (c *Client) renewable() bool { return c.cfg.TokenFile != "" || c.cfg.Username != "" }

// bearer returns the token to send ("" for none). renew drops an exchanged token first.
func (c *Client) bearer(ctx context.Context, renew bool) (string, error) {
	switch {
	case c.cfg.Username != "":
		return c.exchanged(ctx, renew)
	case c.cfg.TokenFile != "":
		b, err := os.ReadFile(c.cfg.TokenFile)
		if err != nil {
			return "", &credentialError{fmt.Errorf("read token file: %w", err)}
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", &credentialError{fmt.Errorf("token file %s is empty", c.cfg.TokenFile)}
		}
		return t, nil
	}
	return c.cfg.Token, nil
}

// exchanged returns a token obtained at /auth/token, exchanging the password for a new one
// when none is held, when renew is set, or when the held one is due for refresh. A failed
// refresh keeps a token that has not expired yet.
func (c *Client) exchanged(ctx context.Context, renew bool) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if renew {
		c.token = ""
	}
	if c.token != "" && (c.refreshAt.IsZero() || now.Before(c.refreshAt)) {
		return c.token, nil
	}
	tok, err := c.exchange(ctx)
	if err != nil {
		if c.token != "" && (c.expires.IsZero() || now.Before(c.expires)) {
			c.log.Warn("token refresh at /auth/token failed; using the current token until it expires",
				zap.Time("expires", c.expires), zap.Error(err))
			return c.token, nil
		}
		return "", err
	}
	c.token = tok
	c.expires, c.refreshAt = refreshTimes(tok, now)
	c.log.Info("obtained an Airflow token at /auth/token", zap.String("username", c.cfg.Username), zap.Time("expires", c.expires))
	return tok, nil
}

// exchange posts the username and password to /auth/token and returns the access token.
func (c *Client) exchange(ctx context.Context) (string, error) {
	pw, err := os.ReadFile(c.cfg.PasswordFile)
	if err != nil {
		return "", &credentialError{fmt.Errorf("read password file: %w", err)}
	}
	body, _ := json.Marshal(map[string]string{"username": c.cfg.Username, "password": strings.TrimRight(string(pw), "\r\n")})
	endpoint := c.base.JoinPath("auth", "token")
	// No key's call: a refused exchange is Airflow's (limit.WithKey with none).
	status, b, _, err := c.roundTrip(limit.WithKey(ctx, nil), http.MethodPost, endpoint.String(), body, "", 64<<10, false)
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		var pe *backoff.PermanentError
		if errors.As(err, &pe) {
			return "", pe.Unwrap()
		}
		return "", fmt.Errorf("token exchange: %w", err)
	}
	if status < 200 || status >= 300 {
		// The body is Airflow's error detail; the request's password is never in it.
		return "", &StatusError{StatusCode: status, Detail: strings.ToValidUTF8(string(b[:min(len(b), 512)]), "?"), Endpoint: "/" + strings.TrimLeft(endpoint.Path, "/")}
	}
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.AccessToken == "" {
		return "", &credentialError{fmt.Errorf("token exchange: %d answer without an access_token", status)}
	}
	return out.AccessToken, nil
}

// refreshTimes reads a JWT's iat and exp claims (without verifying it: the server does) and
// returns when it expires and when to refresh it: after 80% of its lifetime, at the latest a
// minute before it expires. A token without exp is refreshed only after a 401 or 403.
func refreshTimes(tok string, now time.Time) (expires, refreshAt time.Time) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, time.Time{}
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, time.Time{}
	}
	var claims struct {
		Exp, Iat float64
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}, time.Time{}
	}
	expires = time.Unix(int64(claims.Exp), 0)
	issued := now
	if claims.Iat > 0 {
		issued = time.Unix(int64(claims.Iat), 0)
	}
	refreshAt = issued.Add(expires.Sub(issued) * 4 / 5)
	if last := expires.Add(-time.Minute); refreshAt.After(last) {
		refreshAt = last
	}
	return expires, refreshAt
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
