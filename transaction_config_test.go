package kafkatx

import (
	"strings"
	"testing"
	"time"
)

// TestNegativeTransactionBoundIsOffEverywhere: a negative TransactionConfig field means "off"
// in every place that reads it — no SET LOCAL for it in BEGIN, and no stuck report derived
// from it — and zero means the default.
func TestNegativeTransactionBoundIsOffEverywhere(t *testing.T) {
	c := &Config{Transaction: TransactionConfig{StatementTimeout: -1}}
	d := c.WithDefaults()
	if q := d.Transaction.beginSQL(); strings.Contains(q, "statement_timeout") || !strings.Contains(q, "idle_in_transaction_session_timeout = 10000") {
		t.Fatalf("BEGIN with StatementTimeout off: %q", q)
	}
	if got := stuckAfter(d.Transaction); got != 0 {
		t.Fatalf("stuckAfter with StatementTimeout off = %v; want 0 (off, not the default's 60 s)", got)
	}
	if got := stuckAfter((&Config{}).WithDefaults().Transaction); got != StatementTimeoutDefault+IdleTimeoutDefault {
		t.Fatalf("stuckAfter of the defaults = %v", got)
	}
	if got := stuckAfter((&Config{Transaction: TransactionConfig{IdleTimeout: 2 * time.Second}}).WithDefaults().Transaction); got != StatementTimeoutDefault+2*time.Second {
		t.Fatalf("stuckAfter = %v", got)
	}
}
