package flagcheck

import (
	"testing"
	"time"
)

func TestMessagesNameTheFlagValueAndRange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{Int("batch-size", -5, 1, 100000), "--batch-size -5: want 1 to 100,000"},
		{Int("max-attempts", 0, 1, 1000), "--max-attempts 0: want 1 to 1,000"},
		{Duration("exit-when-idle", -time.Second, 0, 24*time.Hour), "--exit-when-idle -1s: a duration must not be negative; want 0s to 24h0m0s"},
		{Duration("poll-interval", 0, time.Millisecond, time.Hour), "--poll-interval 0s: want 1ms to 1h0m0s"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("got %v, want %q", c.err, c.want)
		}
	}
	if err := First(Int("a", 1, 1, 1), Duration("b", time.Second, 0, time.Hour)); err != nil {
		t.Errorf("in range: %v", err)
	}
}
