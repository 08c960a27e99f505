package main

import (
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "a user's first week" 5: a bad value is refused with exit 2 and one line naming the
// flag and its range, before anything starts, instead of being replaced by a default.
func TestBadFlagValuesExit2WithOneLine(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinary(t, "dagservice")
	for args, want := range map[*[]string]string{
		&[]string{"--retention", "-1h"}:  "--retention -1h0m0s: a duration must not be negative",
		&[]string{"--task-delay", "-1s"}: "--task-delay -1s",
		&[]string{"--retention", "1s"}:   "--retention 1s: want 1m0s to 8760h0m0s",
		&[]string{"--addr"}:              "flag needs an argument",
		// Issue 48, F6: a --database-url that does not parse exits 2 before anything
		// connects (it was exit 1), without showing the password.
		&[]string{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus"}:                 "--database-url: the database URL does not parse",
		&[]string{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?default_query_exec_mode=bogus"}: "--database-url: the database URL does not parse",
		&[]string{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x?pool_max_conns=abc"}:            "--database-url: the database URL does not parse",
		&[]string{"--database-url", "postgres://u:s3cret@[::1"}:                                        "--database-url: the database URL does not parse",
		&[]string{"--database-url", "host=127.0.0.1 port=abc password=s3cret"}:                         "--database-url: the database URL does not parse",
		&[]string{"--database-url", "postgres://127.0.0.1:1/x", "--session-database-url", "port=abc"}:  "--session-database-url: the database URL does not parse",
	} {
		testenv.RequireUsageError(t, bin, *args, nil, want)
	}
}
