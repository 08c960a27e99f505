// Package pgstart is a service's first contact with its database: a server that is not ready
// yet — starting up, in recovery or being promoted (SQLSTATE 57P03 cannot_connect_now), shutting
// down, out of connection slots, or not listening at all — is waited for, for a bounded time,
// before the service gives up; a refusal that waiting does not end (a wrong password, a
// database that does not exist, an unknown host, a TLS setup the server refuses) is returned
// at once.
package pgstart

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/pgerr"
)

// Within is how long a service waits at start for a database that is not ready: 60 s, about a
// Patroni failover (ttl 30 s plus loop_wait 10 s) with room to spare.
const Within = 60 * time.Second

// tryTimeout caps one connection attempt (a server that accepts the TCP connection and never
// answers), unless cc has a shorter connect_timeout.
const tryTimeout = 10 * time.Second

// Await returns nil once cc's server accepts a session (one connection, opened and closed
// again): Retry with that connection as its work, each try capped at 10 s unless cc has a
// shorter connect_timeout. The error never holds the password (pgx's messages name the user,
// the database and the host).
func Await(ctx context.Context, cc *pgx.ConnConfig, within time.Duration, log *zap.Logger) error {
	return Retry(ctx, within, log, func(ctx context.Context) error {
		tctx, cancel := context.WithTimeout(ctx, tryTimeout)
		defer cancel()
		conn, err := pgx.ConnectConfig(tctx, cc)
		if err != nil {
			return err
		}
		return conn.Close(context.WithoutCancel(ctx))
	})
}

// Retry runs op, a service's first work on its database (a connection, its migrations),
// until it returns nil. While it fails because the server is not ready (NotYet) it runs again
// with a backoff of 250 ms doubling to 2 s, logs at warn level at the first refusal and every
// 10 s (the condition's name, how long it has waited, the bound) and at info level when op
// succeeds after a refusal; past within it returns the last refusal, saying that it waited.
// Any other error of op is returned at once, as is ctx's end (ctx.Err()).
func Retry(ctx context.Context, within time.Duration, log *zap.Logger, op func(context.Context) error) error {
	start := time.Now()
	var warned time.Time
	backoff := 250 * time.Millisecond
	for try := 1; ; try++ {
		err := op(ctx)
		if err == nil {
			if try > 1 {
				log.Info("database ready; the service starts", zap.Duration("waited", time.Since(start).Round(time.Millisecond)))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		why, ok := NotYet(err)
		if !ok {
			return err
		}
		waited := time.Since(start)
		if waited >= within {
			return fmt.Errorf("the database was not ready within %s of the start (%s): %w", within, why, err)
		}
		if try == 1 || time.Since(warned) >= 10*time.Second {
			warned = time.Now()
			log.Warn("database not ready at start; waiting for it (bounded)", zap.String("condition", why), zap.Error(err),
				zap.Duration("waited", waited.Round(time.Millisecond)), zap.Duration("bound", within))
		}
		t := time.NewTimer(min(backoff, within-waited))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// NotYet reports whether err, from a connection attempt or a service's first statements, is a
// server that may accept the session later, and names its condition: 57P03
// cannot_connect_now (starting up, in recovery, not yet consistent, hot standby off), 57P01
// admin_shutdown and 57P02 crash_shutdown (a restart under way, or the session ended by
// pg_terminate_backend), 53300 too_many_connections, 53000 insufficient_resources, the 08
// class, 55000 from a connection attempt (the database does not accept connections now:
// ALTER DATABASE … ALLOW_CONNECTIONS false, an operator's maintenance), and no answer at all (connection refused or reset, a timeout; pgx's "read only connection"
// for target_session_attrs=read-write while no host is primary yet). Not: a refused login
// (28000, 28P01), a database that does not exist (3D000) or any other SQLSTATE, an unknown
// host, a certificate the client does not trust, a server that refuses TLS.
func NotYet(err error) (condition string, ok bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		d := pgerr.Describe(pe)
		name := pe.Code + " " + d.Name
		switch {
		case pe.Code == "57P03", pe.Code == "57P01", pe.Code == "57P02", pe.Code == "53300", pe.Code == "53000":
			return name, true
		case strings.HasPrefix(pe.Code, "08") && pe.Code != "08P01":
			return name, true
		case pe.Code == "55000" && errors.As(err, new(*pgconn.ConnectError)):
			return pe.Code + " database_not_accepting_connections", true
		}
		return "", false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return "", false
	}
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	if errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) {
		return "", false
	}
	msg := strings.ToLower(err.Error())
	if strings.Contains(msg, "tls error") || strings.Contains(msg, "refused tls") || strings.Contains(msg, "x509:") {
		return "", false
	}
	if pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return "timeout", true
	}
	if d := pgerr.Describe(err); d.Class == pgerr.Server {
		return d.Name, true
	}
	return "", false
}
