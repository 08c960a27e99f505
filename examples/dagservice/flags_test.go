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
	} {
		testenv.RequireUsageError(t, bin, *args, nil, want)
	}
}
