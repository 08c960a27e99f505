package pg

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrAmbiguousURL is what CheckURL and ParseConfig return for a postgres:// URL whose user
// name or password holds a character that must be percent-encoded. The message names the
// characters and their encodings, never any part of the URL: where an unencoded '@' or '#'
// sits, the host, port or database pgx would read are pieces of the password.
var ErrAmbiguousURL = errors.New("the database URL does not parse as meant: a user name or password holding '@', '#', '/' or '?' must percent-encode it " +
	"('@' as %40, '#' as %23, '/' as %2F, '?' as %3F; e.g. python3 -c 'import urllib.parse,sys; print(urllib.parse.quote(sys.argv[1], safe=\"\"))' PASSWORD); " +
	"the URL is not shown, since any part of it may be the password")

// ErrUnparsableDSN is what ParseConfig returns when pgx cannot parse the connection string. pgx's
// own message quotes the string with the password masked as best it can — for a string that
// does not parse, the password's boundaries are unknown — so it is not passed on.
var ErrUnparsableDSN = errors.New("the database URL does not parse (expected postgres://user:password@host:port/database?param=value, " +
	"or key=value pairs such as host=... user=... password=...); the URL is not shown, since any part of it may be the password")

// CheckURL refuses a postgres:// or postgresql:// URL whose user name or password holds an
// unencoded '@', '#', '/' or '?' (RFC 3986: they delimit the URL's parts) with
// ErrAmbiguousURL. The rule: no '#' anywhere (a fragment means nothing to PostgreSQL); at
// most one '@', and none after the first '/' or '?' that follows the "//" (a '/' or '?' in
// the password moves pgx's split of user info and host); no '/' or '?' before the '@'. A
// key=value string is not checked (its quoting is unambiguous). Nil for a URL that parses as
// written; the URL's other faults are pgx's to report.
func CheckURL(dsn string) error {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(dsn, "postgresql://"); !ok {
			return nil
		}
	}
	if strings.Contains(rest, "#") || strings.Count(rest, "@") > 1 {
		return ErrAmbiguousURL
	}
	if at := strings.IndexByte(rest, '@'); at >= 0 && strings.ContainsAny(rest[:at], "/?") {
		return ErrAmbiguousURL
	}
	return nil
}

// ParseConfig is pgxpool.ParseConfig with CheckURL first, and errors that never quote the
// connection string: ErrAmbiguousURL, or ErrUnparsableDSN for what pgx cannot parse.
// Every kafkatx binary and test helper parses a database URL through it (or
// ParsePoolConfig).
func ParseConfig(dsn string) (*pgxpool.Config, error) {
	if err := CheckURL(dsn); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrUnparsableDSN
	}
	return cfg, nil
}
