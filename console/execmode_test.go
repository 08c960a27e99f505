package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The console's statements in every query exec mode pgx v5 offers (issue 48): one incident
// (the fixture), then per mode a console on a pool in that mode answers every page and API
// read with filters (group, topic, partition, error text, time window, fingerprint, history)
// and runs the dry runs of a bulk dead-letter action and an offsets reset.
func TestConsoleInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.firstDeadLetter()
	var items []DeadLetterItem
	_, list := call(t, nil, "GET", f.server(nil).URL+"/api/dead-letters?topic="+url.QueryEscape(f.topic), f.token, "")
	if err := json.Unmarshal([]byte(list), &items); err != nil || len(items) == 0 {
		t.Fatalf("dead letters: %v %s", err, list)
	}
	fp := items[0].Fingerprint
	g, tp := url.QueryEscape(f.group), url.QueryEscape(f.topic)
	since := url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	for _, mode := range testenv.QueryExecModeNames {
		t.Run(mode, func(t *testing.T) {
			pool := testenv.PostgresInMode(t, mode)
			srv := f.server(func(c *Config) { c.Pool = pool })
			for _, p := range []string{"/", "/offsets?group=" + g, "/dead-letters?topic=" + tp, fmt.Sprintf("/dead-letters/%d", id), "/outbox",
				"/api/partitions", "/api/partitions?group=" + g, "/api/partitions/history?group=" + g + "&topic=" + tp + "&partition=0&window=10m",
				"/api/offsets/audit?group=" + g + "&topic=" + tp,
				"/api/dead-letters?group=" + g + "&topic=" + tp + "&partition=0&status=new&q=poison&error_class=permanent&since=" + since + "&fingerprint=" + fp,
				"/api/dead-letters/groups", "/api/dead-letters/export?format=csv&topic=" + tp, "/api/dead-letters/export?format=json",
				fmt.Sprintf("/api/dead-letters/%d", id), "/api/outbox"} {
				if code, body := call(t, nil, "GET", srv.URL+p, f.token, ""); code != http.StatusOK {
					t.Errorf("GET %s: %d %s", p, code, body)
				}
			}
			code, body := call(t, nil, "POST", srv.URL+"/api/dead-letters/discard", f.token,
				fmt.Sprintf(`{"reason":"exec mode","dry_run":true,"filter":{"fingerprint":%q,"topic":%q}}`, fp, f.topic))
			if code != http.StatusOK || !strings.Contains(body, `"done":`) {
				t.Errorf("bulk discard dry run: %d %s", code, body)
			}
			code, body = call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token,
				fmt.Sprintf(`{"group":%q,"topic":%q,"to_offset":15,"mode":"skip","reason":"exec mode","dry_run":true}`, f.group, f.topic))
			if code != http.StatusOK {
				t.Errorf("offsets reset dry run: %d %s", code, body)
			}
		})
	}
}
