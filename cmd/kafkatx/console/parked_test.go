package console

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/parking"
)

// Issue 45, operators: the console lists a group's parked keys (key, head offset, count, age,
// last error, next try) on /parked-keys and GET /api/parked-keys, counts them on the
// partition's row, and shows the partition "blocked by key K at offset X" — needing
// attention — once its watermark has held still with lag for BlockedAfter; a key is shown
// escaped and masked, never raw.
func TestParkedKeysViewAndBlockedByKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // watermark 10, log end 15: lag 5
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	park := func(off int64, key string, attempts int, next time.Time) {
		t.Helper()
		if err := parking.New(f.schema).ParkTx(ctx, tx, parking.Message{Group: f.group, Topic: f.topic, Partition: 0, Offset: off,
			KeyHash: parking.KeyHash([]byte(key), off), Key: []byte(key), Value: []byte("v"), Attempts: attempts,
			ErrorClass: "handler", LastError: "tenant 7 answered 503", NextTry: next}); err != nil {
			t.Fatal(err)
		}
	}
	hot := "tenant-7\x1b[2J" // a control character in a key reaches no page raw
	park(1, hot, 3, time.Now().Add(time.Hour))
	park(5, hot, 0, time.Time{})
	park(8, hot, 0, time.Time{})
	park(2, "k2", 1, time.Time{})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	hotHash := hex.EncodeToString(parking.KeyHash([]byte(hot), 0))
	srv := f.server(func(c *Config) { c.ReadOnly = true }) // a read-only console shows them too

	partitionRow := func() PartitionRow {
		t.Helper()
		code, body := call(t, nil, "GET", srv.URL+"/api/partitions?group="+url.QueryEscape(f.group), f.token, "")
		var rows []PartitionRow
		if err := json.Unmarshal([]byte(body), &rows); code != 200 || err != nil {
			t.Fatalf("GET /api/partitions: %d %v %s", code, err, body)
		}
		for _, r := range rows {
			if r.Topic == f.topic && r.Partition == 0 {
				return r
			}
		}
		t.Fatalf("no row for partition 0: %s", body)
		return PartitionRow{}
	}
	// The watermark moved just now: parked keys, not blocked.
	r := partitionRow()
	if r.Parked == nil || r.Parked.Keys != 2 || r.Parked.Messages != 4 || r.BlockedByKey != nil {
		t.Fatalf("row before the watermark held still: parked %+v, blocked %+v", r.Parked, r.BlockedByKey)
	}
	code, body := call(t, nil, "GET", srv.URL+"/api/parked-keys?group="+url.QueryEscape(f.group), f.token, "")
	var ans parkedKeysAnswer
	if err := json.Unmarshal([]byte(body), &ans); code != 200 || err != nil || len(ans.Keys) != 2 || ans.Truncated {
		t.Fatalf("GET /api/parked-keys: %d %v %s", code, err, body)
	}
	k := ans.Keys[0] // head offset order: the hot key's head is 1
	if k.KeyHash != hotHash || k.HeadOffset != 1 || k.Count != 3 || k.Attempts != 3 || k.LastError != "tenant 7 answered 503" || k.NextTry == nil ||
		strings.Contains(k.Key, "\x1b") || !strings.Contains(k.Key, `\x1b[2J`) {
		t.Fatalf("hot key: %+v", k)
	}
	if ans.Keys[1].NextTry != nil || ans.Keys[1].HeadOffset != 2 {
		t.Fatalf("k2, due now: %+v", ans.Keys[1])
	}
	for _, bad := range []string{"partition=x&topic=t", "partition=0", "partition=-1&topic=t"} {
		if code, _ := call(t, nil, "GET", srv.URL+"/api/parked-keys?group=g&"+bad, f.token, ""); code != 400 {
			t.Fatalf("GET /api/parked-keys?%s: %d, want 400", bad, code)
		}
	}

	// The watermark held still for longer than BlockedAfter with lag: blocked by the hot key.
	if _, err := f.pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.watermarks SET updated_at = now() - interval '10 minutes' WHERE group_id = $1`, f.schema), f.group); err != nil {
		t.Fatal(err)
	}
	r = partitionRow()
	if b := r.BlockedByKey; b == nil || b.Offset != 10 || b.KeyHash != hotHash || b.Count != 3 || !r.NeedsAttention ||
		!strings.Contains(b.Why, "blocked by key") {
		t.Fatalf("row with the watermark held: blocked %+v, needs attention %v", b, r.NeedsAttention)
	}
	_, page := call(t, nil, "GET", srv.URL+"/", f.token, "")
	tr := rowHTML(page, f.group+"|"+f.topic+"|0")
	if !strings.Contains(tr, "blocked by key") || !strings.Contains(tr, "at offset 10") || !strings.Contains(tr, "2 parked key(s), 4 message(s)") ||
		!strings.Contains(page, "blocked_by_key") || strings.Contains(page, "\x1b") {
		t.Fatalf("the partitions page's row does not show the blocked state: %s", tr)
	}
	_, page = call(t, nil, "GET", srv.URL+"/parked-keys?group="+url.QueryEscape(f.group)+"&topic="+url.QueryEscape(f.topic)+"&partition=0", f.token, "")
	if !strings.Contains(page, hotHash) || !strings.Contains(page, "blocked by key") || !strings.Contains(page, "tenant 7 answered 503") ||
		strings.Contains(page, "\x1b") || !strings.Contains(page, `id="parked-keys"`) {
		t.Fatalf("the parked keys page: %.3000s", page)
	}
}
