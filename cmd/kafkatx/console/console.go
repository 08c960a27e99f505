// Package console is kafkatx's operator console: a web UI and a JSON API over the same data
// and actions as the kafkatx command — partitions (the database watermark against Kafka's
// committed offset, drift, the offset audit trail, lockstep resets), dead letters (filtered,
// grouped by failure fingerprint, replayed or discarded after a dry run) and the outbox
// (backlog, parked rows, the relay's leader, replication slots).
//
// New returns an http.Handler. `kafkatx console` serves it on 127.0.0.1; a service may mount
// it under a path prefix of its own server:
//
//	h, err := console.New(console.Config{Pool: pool, Kafka: kafka.ConfigMap{"bootstrap.servers": b},
//		TokenFile: "/run/secrets/console-token", BasePath: "/ops"})
//	mux.Handle("/ops/", http.StripPrefix("/ops", h))
//
// Every page and API call needs the token (Config.TokenFile), as `Authorization: Bearer
// <token>` or through a session the sign-in page opens; see docs/console.md for the whole
// API and the security model.
package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/shards"
)

// Limits of every request.
const (
	// MaxBodyBytes bounds a request body (a JSON action or a form), in bytes.
	MaxBodyBytes = 64 << 10
	// RequestTimeout bounds the database and Kafka work of one request.
	RequestTimeout = 30 * time.Second
	// SessionTTL is how long a browser session lasts after sign-in.
	SessionTTL = 12 * time.Hour
	// MinTokenBytes is the shortest token accepted, in bytes after trimming.
	MinTokenBytes = 16
)

// Config configures a console.
type Config struct {
	// Pool reaches kafkatx's tables. Required.
	Pool *pgxpool.Pool
	// Schema of kafkatx's tables. Defaults to pg.DefaultSchema ("kafkatx").
	Schema string
	// Kafka holds librdkafka settings for the admin client: bootstrap.servers (required) and
	// any security.protocol, sasl.* and ssl.* settings. Never rendered or logged.
	Kafka kafka.ConfigMap
	// TokenFile holds the token (trimmed of surrounding white space, at least MinTokenBytes).
	// It is read again when its size or modification time changes; a session opened with
	// an older token ends. Required.
	TokenFile string
	// ReadOnly refuses every action with 403 and hides the action forms.
	ReadOnly bool
	// BasePath is the path prefix the handler is mounted under (with http.StripPrefix),
	// such as "/ops"; "" when served at the root. Links and the session cookie use it.
	BasePath string
	// Logger receives one line per action and errors; nil means no logging.
	Logger *zap.Logger
	// Secrets are extra strings never rendered: every answer replaces them with "***". The
	// password of Pool's connection and the Kafka settings' sasl.password and ssl.*password
	// are added by New.
	Secrets []string
	// SampleEvery is how often the console samples every partition's watermark and log end
	// into the partition_samples table, for the lag and throughput charts. Defaults to
	// SampleEveryDefault (1 minute); negative: no sampling (the charts show what others
	// sampled).
	SampleEvery time.Duration
	// SampleRetention is how long samples are kept; older ones are deleted at each sampling.
	// Defaults to SampleRetentionDefault (7 days).
	SampleRetention time.Duration
	// Actor names the console process in audit rows, after the operator's name and address.
	// Defaults to the OS user at the host name (as the kafkatx command records).
	Actor string
	// AirflowDrift, when set, compares a group's Airflow ledger with Airflow (`kafkatx
	// console --airflow-url` sets it to what `kafkatx airflow status` does); the offsets page
	// and GET /api/airflow/drift show the counts, each group's kept for AirflowDriftTTL. nil:
	// no Airflow section. Credentials it uses belong in Secrets.
	AirflowDrift func(ctx context.Context, group string) (AirflowDrift, error)
	// Shards, when set, are a sharded service's shards (kafkatx console --shard NAME=URL ...)
	// and Pool is its directory's database: the partitions and offsets pages and GET
	// /api/partitions read every shard (offsets.ShardedStatus, as kafkatx offsets status
	// --shard), each row naming its shard (PartitionRow.Shard) and any stale copy; offset
	// resets from the console are refused (kafkatx offsets reset --shard acts on the right
	// shard). The shards' connection passwords belong in Secrets. nil: one database.
	Shards *shards.Set
}

// Handler is the console. It is safe for concurrent use; Close releases its Kafka client.
type Handler struct {
	cfg       Config
	log       *zap.Logger
	op        *offsets.Operator
	shardOps  []offsets.ShardOperator // with Config.Shards: one operator per shard
	kafka     *offsets.Kafka
	tokens    *tokenSource
	sessions  *sessionStore
	mux       *http.ServeMux
	mask      *mask
	stop      chan struct{} // ends the sampling loop
	stopped   chan struct{}
	closeOnce sync.Once
	airflow   airflowCache
}

// New checks cfg, reads the token file and connects the Kafka admin client.
func New(cfg Config) (*Handler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("console: Config.Pool is required")
	}
	if cfg.Kafka == nil || cfg.Kafka["bootstrap.servers"] == nil {
		return nil, errors.New("console: Config.Kafka needs bootstrap.servers")
	}
	if cfg.TokenFile == "" {
		return nil, errors.New("console: Config.TokenFile is required")
	}
	cfg.BasePath = strings.TrimRight(cfg.BasePath, "/")
	if cfg.BasePath != "" && !strings.HasPrefix(cfg.BasePath, "/") {
		return nil, fmt.Errorf("console: BasePath %q must start with /", cfg.BasePath)
	}
	cfg.Schema = pg.SchemaOr(cfg.Schema)
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = SampleEveryDefault
	}
	if cfg.SampleRetention <= 0 {
		cfg.SampleRetention = SampleRetentionDefault
	}
	if cfg.Actor == "" {
		cfg.Actor = offsets.Actor()
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	tokens, err := newTokenSource(cfg.TokenFile, log)
	if err != nil {
		return nil, err
	}
	kcfg := kafka.ConfigMap{}
	for k, v := range cfg.Kafka {
		kcfg[k] = v
	}
	if _, ok := kcfg["client.id"]; !ok {
		kcfg["client.id"] = "kafkatx-console"
	}
	k, err := offsets.NewKafka(kcfg, log)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	h := &Handler{cfg: cfg, log: log, kafka: k, op: offsets.NewOperator(cfg.Pool, k, cfg.Schema), tokens: tokens,
		sessions: newSessionStore()}
	if cfg.Shards != nil {
		if err := cfg.Shards.Validate(); err != nil {
			k.Close()
			return nil, fmt.Errorf("console: %w", err)
		}
		for _, sh := range cfg.Shards.Shards {
			h.shardOps = append(h.shardOps, offsets.ShardOperator{Shard: sh.Name, Op: h.op.On(sh.Pool)})
		}
	}
	h.mask = newMask(secretList(cfg))
	h.routes()
	h.stop, h.stopped = make(chan struct{}), make(chan struct{})
	if cfg.SampleEvery > 0 {
		go h.sampleLoop(h.stop, h.stopped)
	} else {
		close(h.stopped)
	}
	return h, nil
}

// Close stops the sampling and releases the Kafka admin client. The pool stays the caller's.
func (h *Handler) Close() {
	h.closeOnce.Do(func() {
		close(h.stop)
		<-h.stopped
		h.kafka.Close()
	})
}

// secretList is every secret the console knows of: Config.Secrets, the pool's password and
// the Kafka settings' passwords and secrets.
func secretList(cfg Config) []string {
	list := append([]string{}, cfg.Secrets...)
	list = append(list, cfg.Pool.Config().ConnConfig.Password)
	if cfg.Shards != nil {
		for _, sh := range cfg.Shards.Shards {
			if sh.Pool != nil {
				list = append(list, sh.Pool.Config().ConnConfig.Password)
			}
		}
	}
	for k, v := range cfg.Kafka {
		if strings.Contains(k, "password") || strings.Contains(k, "secret") || k == "sasl.oauthbearer.config" {
			if s, ok := v.(string); ok {
				list = append(list, s)
			}
		}
	}
	return list
}

// secretPairs is the text masker of list (tests use it alone).
func secretPairs(list []string) *strings.Replacer { return newMask(list).text }

// redact removes every known secret from s.
func (h *Handler) redact(s string) string { return h.mask.String(s) }

// ServeHTTP answers one request: security headers, bounded body and time, authentication,
// CSRF protection for sessions, the read-only refusal of actions, then the route.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	}
	ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	if isPublic(r) {
		h.mux.ServeHTTP(w, r)
		return
	}
	who, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if who.session != nil {
			if o := r.Header.Get("Origin"); !sameOrigin(r, o) {
				h.fail(w, r, http.StatusForbidden, "refused: the request comes from another site (Origin "+pg.SanitizeText(o, 200)+"), not this console's pages; a reverse proxy must pass the Host header through")
				return
			}
			if !h.checkCSRF(r, who.session) {
				h.fail(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
				return
			}
		}
		if h.cfg.ReadOnly && r.URL.Path != "/signout" {
			h.fail(w, r, http.StatusForbidden, "this console is read-only (--read-only): actions are refused")
			return
		}
	}
	h.mux.ServeHTTP(w, r.WithContext(withIdentity(ctx, who)))
}

// isPublic reports the paths served without credentials: the sign-in page and the static
// assets (style sheet and script; they hold no data).
func isPublic(r *http.Request) bool {
	return r.URL.Path == "/signin" || strings.HasPrefix(r.URL.Path, "/static/")
}

// routes registers every page and API call.
func (h *Handler) routes() {
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(staticFS)))
	m.HandleFunc("GET /signin", h.signinPage)
	m.HandleFunc("POST /signin", h.signin)
	m.HandleFunc("POST /signout", h.signout)

	m.HandleFunc("GET /{$}", h.partitionsPage)
	m.HandleFunc("GET /offsets", h.offsetsPage)
	m.HandleFunc("POST /offsets/reset", h.offsetsResetForm)
	m.HandleFunc("GET /dead-letters", h.deadLettersPage)
	m.HandleFunc("GET /dead-letters/{id}", h.deadLetterPage)
	m.HandleFunc("POST /dead-letters/action", h.deadLettersActionForm)
	m.HandleFunc("GET /outbox", h.outboxPage)
	m.HandleFunc("POST /outbox/action", h.outboxActionForm)
	m.HandleFunc("GET /parked-keys", h.parkedKeysPage)

	m.HandleFunc("GET /api/partitions", h.apiPartitions)
	m.HandleFunc("GET /api/partitions/history", h.apiHistory)
	m.HandleFunc("GET /api/offsets/audit", h.apiOffsetAudit)
	m.HandleFunc("POST /api/offsets/reset", h.apiOffsetsReset)
	m.HandleFunc("GET /api/dead-letters", h.apiDeadLetters)
	m.HandleFunc("GET /api/dead-letters/groups", h.apiDeadLetterGroups)
	m.HandleFunc("GET /api/dead-letters/export", h.apiDeadLettersExport)
	m.HandleFunc("GET /api/dead-letters/{id}", h.apiDeadLetter)
	m.HandleFunc("POST /api/dead-letters/{id}/{action}", h.apiDeadLetterAction)
	m.HandleFunc("POST /api/dead-letters/{action}", h.apiDeadLettersAction)
	m.HandleFunc("GET /api/outbox", h.apiOutbox)
	m.HandleFunc("GET /api/airflow/drift", h.apiAirflowDrift)
	m.HandleFunc("POST /api/outbox/{id}/{action}", h.apiOutboxAction)
	m.HandleFunc("GET /api/parked-keys", h.apiParkedKeys)
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "no such API call: see docs/console.md")
	})
	h.mux = m
}
