package httpmw

import (
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/pg"
)

// Config configures the middleware. A nil *Config means all defaults.
type Config struct {
	// Schema holds kafkatx's tables (idempotency_responses). Defaults to "kafkatx".
	Schema string

	// Scope returns the namespace of a request's key (valid UTF-8 without NUL, at most
	// idempotency.MaxScopeBytes; otherwise the request gets 500 and the log says why), so that two clients (or two services
	// sharing one table) choosing the same key do not see each other's responses; the draft
	// asks servers to scope keys per client, for example by the authenticated principal.
	// The result must be valid UTF-8 without NUL bytes. Defaults to "" for every request.
	Scope func(r *http.Request) string

	// Optional lets requests without an Idempotency-Key header through: their handler runs
	// in a transaction as usual but nothing is stored. Defaults to false: a missing key is
	// refused with 400 Bad Request, as the draft allows for resources that require one.
	Optional bool

	// Retention is how long a stored response is replayed; after it the key may be used
	// again and the idempotency Janitor deletes the row. The draft leaves the expiry policy
	// to the server and asks for it to be documented. pg.KeepForever (any negative
	// duration) keeps responses forever. Defaults to 24 hours.
	Retention time.Duration

	// ReplayHeaders are the response headers stored and replayed, by canonical name; other
	// headers the handler set go to the first client only. Defaults to Content-Type,
	// Content-Language, Content-Location, Location and ETag.
	ReplayHeaders []string

	// Final reports whether a response with status is the request's final answer: stored
	// and replayed, with the handler's database work committed. Otherwise the transaction
	// rolls back, nothing is stored, and a retry with the same key runs the handler again.
	// Defaults to DefaultFinal: every status below 500 except 408, 409, 425 and 429.
	Final func(status int) bool

	// MaxKeyLength is the longest accepted key, in bytes; a longer one gets 400. Defaults
	// to 255; New refuses more than idempotency.MaxKeyBytes (1,024): the key is in the
	// stored responses' primary key, which PostgreSQL bounds (about 2,700 bytes an entry).
	MaxKeyLength int

	// MaxBodyBytes bounds the request body, which the middleware reads whole to fingerprint
	// it; a larger body gets 413 Content Too Large. Defaults to 1 MiB.
	MaxBodyBytes int64

	// InFlightTimeout bounds how long the first request's transaction may sit idle between
	// statements (PostgreSQL's idle_in_transaction_session_timeout, set for the transaction
	// only). While that transaction is open a repeat gets 409; a process that crashes
	// releases the key at once (its connection closes), and this timeout also frees a key
	// held by a process that hangs or lost its network. A handler that spends longer than
	// this outside the database between two queries is rolled back (500). Negative leaves
	// the server's setting alone. Defaults to 5 minutes.
	InFlightTimeout time.Duration

	// TxOptions starts the transaction handed to the handler. Defaults to READ COMMITTED.
	// Under REPEATABLE READ or SERIALIZABLE a repeat racing with the first request's commit
	// may get 409 rather than the replay; the client's retry then gets the replay.
	TxOptions pgx.TxOptions

	// Logger receives the middleware's logs, named "kafkatx.idempotency.http". Request
	// bodies and keys are never logged. Defaults to zap.NewNop().
	Logger *zap.Logger
}

// DefaultFinal is the default Config.Final: every status below 500 is final except 408
// Request Timeout, 409 Conflict, 425 Too Early and 429 Too Many Requests, which ask the
// client to try again. A 5xx answer means the server failed, so its transaction rolls back
// and it is not stored: storing it would make a transient failure the permanent answer for
// a request whose work never committed. This follows the draft's intent that a retried
// request with the same key yields the outcome of one successful execution.
func DefaultFinal(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

func (c *Config) withDefaults() Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	out.Schema = pg.SchemaOr(out.Schema)
	if out.Scope == nil {
		out.Scope = func(*http.Request) string { return "" }
	}
	if out.Retention == 0 {
		out.Retention = 24 * time.Hour
	}
	if out.ReplayHeaders == nil {
		out.ReplayHeaders = []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag"}
	}
	names := make([]string, len(out.ReplayHeaders))
	for i, h := range out.ReplayHeaders {
		names[i] = http.CanonicalHeaderKey(h)
	}
	out.ReplayHeaders = names
	if out.Final == nil {
		out.Final = DefaultFinal
	}
	if out.MaxKeyLength <= 0 {
		out.MaxKeyLength = 255
	}
	if out.MaxBodyBytes <= 0 {
		out.MaxBodyBytes = 1 << 20
	}
	if out.InFlightTimeout == 0 {
		out.InFlightTimeout = 5 * time.Minute
	}
	if out.TxOptions.IsoLevel == "" {
		out.TxOptions.IsoLevel = pgx.ReadCommitted
	}
	if out.Logger == nil {
		out.Logger = zap.NewNop()
	}
	out.Logger = out.Logger.Named("kafkatx.idempotency.http")
	return out
}

// retentionMicros is Retention for the SQL, in microseconds; nil (NULL: 'infinity') keeps the
// response forever.
func (c *Config) retentionMicros() *int64 {
	if c.Retention < 0 {
		return nil
	}
	us := c.Retention.Microseconds()
	return &us
}
