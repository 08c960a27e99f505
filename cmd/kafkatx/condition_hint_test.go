package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A fresh-eyes attack: a wrong password (28P01) or a missing database (3D000) was told "run it
// again when it ends", as for a full disk: a typo never ends. The hint now points at the
// connection settings for those, and keeps "when it ends" for conditions that pass.
func TestConditionHintTellsAConfigurationFromAPassingCondition(t *testing.T) {
	for _, c := range []struct {
		code, want, not string
	}{
		{"28P01", "check --database-url", "when it ends"},
		{"28000", "check --database-url", "when it ends"},
		{"3D000", "check --database-url", "when it ends"},
		{"53100", "run it again when it ends", "check --database-url"},
		{"57P03", "run it again when it ends", "check --database-url"},
	} {
		h := conditionHint(fmt.Errorf("connect: %w", &pgconn.PgError{Code: c.code}))
		if !strings.Contains(h, c.want) || strings.Contains(h, c.not) {
			t.Errorf("SQLSTATE %s: hint %q, want %q and not %q", c.code, h, c.want, c.not)
		}
	}
	if h := conditionHint(errors.New("a command's own error")); h != "" {
		t.Errorf("a non-database error gets the hint %q", h)
	}
}

// A fresh-eyes attack: a --database-url (or --shard URL) whose host does not resolve was told
// "the database's own condition (connection_refused) … run it again when it ends", and its
// error printed as one Go-quoted string with pgconn's "\n\t" in it. A name that does not
// resolve is a setting to check; the error prints as one plain line.
func TestAHostThatDoesNotResolveIsASettingToCheck(t *testing.T) {
	_, lookup := net.LookupHost("nohost.invalid")
	if lookup == nil {
		t.Fatal("nohost.invalid resolved")
	}
	err := fmt.Errorf("database: failed to connect to `user=u database=x`:\n\thostname resolving error: %w", lookup)
	h := conditionHint(fmt.Errorf("%w; %w", &pgconn.ConnectError{}, err))
	if !strings.Contains(h, "does not resolve") || strings.Contains(h, "when it ends") {
		t.Errorf("hint %q", h)
	}
	if line := errLine(err); strings.ContainsAny(line, "\n\t") || strings.HasPrefix(line, `"`) {
		t.Errorf("printed as %q", line)
	}
}
