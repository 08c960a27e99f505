package walrelay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A fresh-eyes attack found it: after three Patroni failovers in a row the permanent slot's copy
// on the new leader pointed into WAL the node no longer had; every START_REPLICATION failed with
// SQLSTATE 58P01 ("requested WAL segment … has already been removed") and the relay reconnected
// 254 times in 10 minutes, warning each time, while the consumer's backpressure held every
// partition. Such a slot can never be streamed: the stream's 58P01 is a FatalError naming the
// checkpoint and the recovery commands, as for a missing or invalidated slot; any other stream
// error is still retried.
func TestSlotWhoseWALWasRemovedStopsTheRelayWithTheRecovery(t *testing.T) {
	tl, err := parseTimelines(4, []byte("1\t0/3000000\tno recovery target specified\n2\t0/E500000\tno recovery target specified\n3\t0/F000000\tno recovery target specified\n"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	ck := checkpoint{LSN: lsn(t, "0/21413D30"), Timeline: 4, At: at}
	removed := fmt.Errorf("walrelay: stream: %w", &pgconn.PgError{Severity: "ERROR", Code: "58P01",
		Message: "requested WAL segment 00000002000000000000000E has already been removed"})
	got := slotUnreadable(removed, "kafkatx_outbox", "orders", ck, tl)
	var fe *FatalError
	if !errors.As(got, &fe) {
		t.Fatalf("58P01 from the stream: %v, want a FatalError", got)
	}
	for _, want := range []string{"kafkatx_outbox", "cannot be streamed", "00000002000000000000000E", "0/21413D30",
		"kafkatx outbox drop-slot --force --schema orders, then kafkatx migrate up --outbox-mode wal --schema orders", "--to-time 2026-12-03T16:59:59Z --mode replay --reason TEXT --execute"} {
		if !strings.Contains(got.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, got)
		}
	}
	other := fmt.Errorf("walrelay: stream: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
	if got := slotUnreadable(other, "kafkatx_outbox", "orders", ck, tl); got != other {
		t.Fatalf("57P01 from the stream became %v, want it returned as it is (retried)", got)
	}
	if got := slotUnreadable(nil, "kafkatx_outbox", "orders", ck, tl); got != nil {
		t.Fatalf("no error became %v", got)
	}
}
