package console

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 36: a bulk redrive is rate limited — three replays at 2 a second take at least a
// second (the items start at 0, 0.5 and 1 s) — and a selection that cannot finish within the
// request's time at its rate is refused before anything changes. A dry run is not slowed.
func TestBulkRedriveIsRateLimited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.server(func(c *Config) { c.SampleEvery = -1 })
	var ids []string
	for i := range 3 {
		ids = append(ids, fmt.Sprint(f.count(`INSERT INTO %s.dead_letters (group_id, topic, partition, "offset", value, error_class, error_message, attempts, first_failure_at, last_failure_at)
			VALUES ('rate', 'rate.t', 0, $1, 'v', 'permanent', 'x', 1, now(), now()) RETURNING id`, i)))
	}
	body := func(dry bool, rate int, ids string) string {
		return fmt.Sprintf(`{"reason": "redrive", "dry_run": %v, "rate_per_second": %d, "ids": [%s]}`, dry, rate, ids)
	}
	start := time.Now()
	code, resp := call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token, body(true, 2, strings.Join(ids, ",")))
	if dry := time.Since(start); code != 200 || dry > 900*time.Millisecond {
		t.Fatalf("dry run: %d in %v: %s (a dry run is not slowed)", code, dry, resp)
	}
	start = time.Now()
	code, resp = call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token, body(false, 2, strings.Join(ids, ",")))
	took := time.Since(start)
	var res ActionResult
	if err := json.Unmarshal([]byte(resp), &res); code != 200 || err != nil || res.Done != 3 {
		t.Fatalf("replay: %d %s", code, resp)
	}
	if took < time.Second {
		t.Fatalf("three replays at 2 a second took %v, want at least 1 s", took)
	}
	var many []string
	for i := 1; i <= 1000; i++ {
		many = append(many, fmt.Sprint(1_000_000+i))
	}
	code, resp = call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token, body(false, 1, strings.Join(many, ",")))
	if code != 400 || !strings.Contains(resp, "raise rate_per_second or select fewer") {
		t.Fatalf("1,000 items at 1 a second: %d %s, want 400 naming the rate", code, resp)
	}
	if code, resp = call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token, body(false, 5000, ids[0])); code != 400 || !strings.Contains(resp, "rate_per_second 5000: want 1 to 1000") {
		t.Fatalf("rate 5000: %d %s", code, resp)
	}
}
