package pg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/pg"
)

// TestAmbiguousURLsAreRefusedWithoutThePassword: a password with an unencoded '@', '#', '/'
// or '?' is refused, and the error holds no part of the URL after the scheme.
func TestAmbiguousURLsAreRefusedWithoutThePassword(t *testing.T) {
	for _, u := range []string{
		"postgres://kafkatx_dev:ss#CANARY71@x@127.0.0.1:1/nodb",
		"postgres://kafkatx_dev:p@ss#CANARY72@127.0.0.1:1/nodb",
		"postgres://u:ss#CANARY73@127.0.0.1:5432/db",
		"postgresql://u:p@ssCANARY74@127.0.0.1:5432/db",
		"postgres://u:5432/CANARY75@127.0.0.1/db",
		"postgres://u:a?CANARY76@127.0.0.1/db",
		"postgres://u:CANARY77/x@127.0.0.1:5432/db?sslmode=disable",
	} {
		_, err := pg.ParseConfig(u)
		if !errors.Is(err, pg.ErrAmbiguousURL) {
			t.Errorf("%s: %v, want ErrAmbiguousURL", u, err)
			continue
		}
		if strings.Contains(err.Error(), "CANARY") || strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("%s: the error shows part of the URL: %v", u, err)
		}
	}
}

// TestUnparsableURLShowsNoPart: pgx's parse error (which quotes the string, masking what it
// takes for the password) is replaced by one that quotes nothing.
func TestUnparsableURLShowsNoPart(t *testing.T) {
	for _, u := range []string{"postgres://u:CANARY81@127.0.0.1:port/db", "host=127.0.0.1 password='CANARY82", "postgres://u:CANARY83@[::1/db"} {
		_, err := pg.ParseConfig(u)
		if !errors.Is(err, pg.ErrUnparsableDSN) || strings.Contains(err.Error(), "CANARY") {
			t.Errorf("%s: %v, want ErrUnparsableDSN without the password", u, err)
		}
	}
}

// TestWellFormedURLsParse: encoded passwords, key=value strings, several hosts and query
// parameters are accepted as pgx reads them.
func TestWellFormedURLsParse(t *testing.T) {
	for u, pw := range map[string]string{
		"postgres://u:p%40ss%23x%2Fy%3Fz@127.0.0.1:5432/db?sslmode=disable":       "p@ss#x/y?z",
		"postgresql://u:plain@h1:5432,h2:5433/db?target_session_attrs=read-write": "plain",
		"postgres://127.0.0.1/db":              "",
		"host=127.0.0.1 user=u password=a@b#c": "a@b#c",
		"postgres:///db?host=/tmp":             "",
	} {
		cfg, err := pg.ParseConfig(u)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		if cfg.ConnConfig.Password != pw {
			t.Errorf("%s: password %q, want %q", u, cfg.ConnConfig.Password, pw)
		}
	}
}
