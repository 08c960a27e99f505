package main

import (
	"errors"
	"fmt"
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
