package pg

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTransactionPooled is wrapped by RequireSession's error, and so by every kafkatx operation
// that needs a database session across transactions (a session-level advisory lock: the
// migrations' lock, the relay's leadership; LISTEN), when the connection goes through a
// transaction pooler such as PgBouncer in pool_mode=transaction. There such a lock stays on
// whichever server connection took it and LISTEN hears nothing: what needs a session must
// reach PostgreSQL directly or through a session pooler. The message names no remedy; each
// caller adds the one its user has: kafkatx.Migrate (and so Consumer.Run) names
// `kafkatx migrate up` and Config.SkipMigrations, package outbox/relay names
// relay.Config.Session, and the binaries name their --session-database-url.
var ErrTransactionPooled = errors.New("the connection goes through a transaction pooler (PgBouncer pool_mode=transaction?): session-level locks and LISTEN do not survive between transactions there, so what needs them must reach PostgreSQL directly or through a session pooler")

// RequireSession returns nil when conn keeps one PostgreSQL backend across transactions (a
// direct connection, or a session pooler), and an error wrapping ErrTransactionPooled when
// it does not. The backend pid PostgreSQL sends at startup (BackendKeyData) is the one
// pg_backend_pid() reports on a direct connection; a pooler usually sends its own key. The
// probe then decides between a session and a transaction pooler: it opens a second
// connection with conn's configuration, holds a transaction open on it, and compares
// backend pids — under a transaction pooler either the second connection gets the backend
// conn just used, or conn's next statement runs on another backend; under a session pooler
// neither can happen. A round where neither happened proves nothing when other clients
// share the pooler (one of them may have taken the backend conn released), so the probe
// runs up to probeRounds rounds (one when the startup pid matched) before it calls the
// connection a session. The probe uses the simple protocol (no prepared statements); other
// errors (connecting, querying) are returned as they are.
func RequireSession(ctx context.Context, conn *pgx.Conn) error {
	pooled, err := probePooled(ctx, conn)
	if err != nil {
		return err
	}
	if pooled {
		return fmt.Errorf("%w (host %s port %d)", ErrTransactionPooled, conn.Config().Host, conn.Config().Port)
	}
	return nil
}

// probeRounds bounds the session/transaction rounds of the probe through a pooler. One
// round is conclusive on an idle transaction pooler (PgBouncer hands the most recently
// released server connection out first); more cover a busy one.
const probeRounds = 8

func backendPID(ctx context.Context, q Querier) (int32, error) {
	var pid int32
	err := q.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}

func probePooled(ctx context.Context, conn *pgx.Conn) (bool, error) {
	p1, err := backendPID(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("session probe: %w", err)
	}
	rounds := probeRounds
	if uint32(p1) == conn.PgConn().PID() {
		// The startup's BackendKeyData names this backend: PostgreSQL itself answered, or a
		// pooler that passes the key through. One round tells the latter apart.
		rounds = 1
	}
	cfg := conn.Config().Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("session probe: connect: %w", err)
	}
	defer other.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	for range rounds {
		pooled, err := probeRound(ctx, conn, other)
		if err != nil || pooled {
			return pooled, err
		}
	}
	return false, nil
}

// probeRound reads conn's backend pid, holds a transaction open on other, and reports
// whether that proves transaction pooling: other got the backend conn just released, or
// conn's next statement runs on another one. Reading conn's pid right before other begins
// makes its backend the one a LIFO pooler such as PgBouncer hands out next.
func probeRound(ctx context.Context, conn, other *pgx.Conn) (bool, error) {
	p1, err := backendPID(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("session probe: %w", err)
	}
	tx, err := other.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("session probe: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	p2, err := backendPID(ctx, tx)
	if err != nil {
		return false, fmt.Errorf("session probe: %w", err)
	}
	p3, err := backendPID(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("session probe: %w", err)
	}
	return p2 == p1 || p3 != p1, nil
}

// ParsePoolConfig is pgxpool.ParseConfig for a URL that may go through a transaction pooler.
// Unless the URL sets default_query_exec_mode itself, it connects once and, when
// RequireSession finds a transaction pooler, sets ConnConfig.DefaultQueryExecMode to
// pgx.QueryExecModeExec: the extended protocol with the unnamed statement, parameters typed
// from their Go values, one round trip, no named prepared statements — which a transaction
// pooler cannot keep (PgBouncer before 1.21 has no prepared-statement support at all). pooled
// reports what the probe found (false when the URL chose the mode). The URL is parsed by
// ParseConfig (ErrAmbiguousURL, ErrUnparsableDSN: no part of the URL in the error); a failed
// connection's error is pgx's, which names the user and database, never the password.
func ParsePoolConfig(ctx context.Context, url string) (cfg *pgxpool.Config, pooled bool, err error) {
	cfg, err = ParseConfig(url)
	if err != nil {
		return nil, false, err
	}
	if strings.Contains(url, "default_query_exec_mode=") {
		return cfg, false, nil
	}
	cc := cfg.ConnConfig.Copy()
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	pooled, err = probePooled(ctx, conn)
	if err != nil {
		return nil, false, err
	}
	if pooled {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	return cfg, pooled, nil
}
