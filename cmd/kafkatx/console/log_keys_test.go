package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Issue "Kafka's side of the history": one offset of two logs (the topic recreated and the
// new log adopted) is two dead letters, and the console says which log each came from; the
// throughput chart does not take a log's adoption for records processed.
func TestConsoleNamesTheLogOfDeadLettersAndChartsNoRateAcrossLogs(t *testing.T) {
	t.Parallel()
	f := newSchemaFixture(t)
	dl := pgx.Identifier{f.schema, "dead_letters"}.Sanitize()
	var oldID int64
	if err := f.pool.QueryRow(t.Context(), `INSERT INTO `+dl+` (group_id, topic, partition, "offset", value, error_class, error_message, attempts,
			first_failure_at, last_failure_at, topic_id, cluster_id)
		VALUES ('g', 'orders', 0, 7, 'old', 'permanent', 'bad', 1, now(), now(), 'OldTopicId', 'C1'),
		       ('g', 'orders', 0, 7, 'new', 'permanent', 'bad', 1, now(), now(), 'NewTopicId', 'C1') RETURNING id`).Scan(&oldID); err != nil {
		t.Fatal(err)
	}
	samples := pgx.Identifier{f.schema, "partition_samples"}.Sanitize()
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO `+samples+` (group_id, topic, partition, at, watermark, log_end, lag, topic_id) VALUES
		('g', 'orders', 0, now() - interval '3 minutes', 100, 100, 0, 'OldTopicId'),
		('g', 'orders', 0, now() - interval '2 minutes', 160, 160, 0, 'OldTopicId'),
		('g', 'orders', 0, now() - interval '1 minute', 170, 400, 230, 'NewTopicId')`); err != nil {
		t.Fatal(err)
	}
	srv := f.server(nil)
	c := &http.Client{}
	code, body := call(t, c, "GET", srv.URL+"/api/dead-letters?group=g", f.token, "")
	if code != 200 || !strings.Contains(body, `"topic_id":"OldTopicId"`) || !strings.Contains(body, `"topic_id":"NewTopicId"`) {
		t.Fatalf("GET /api/dead-letters: %d, does not name both logs:\n%s", code, body)
	}
	code, body = call(t, c, "GET", srv.URL+"/api/dead-letters/export?group=g&format=csv", f.token, "")
	if code != 200 || !strings.Contains(body, "topic_id,cluster_id") || !strings.Contains(body, "OldTopicId,C1") {
		t.Fatalf("CSV export: %d, no topic_id and cluster_id columns:\n%s", code, body)
	}
	sc, _ := signIn(t, srv, f.token)
	code, body = call(t, sc, "GET", srv.URL+fmt.Sprintf("/dead-letters/%d", oldID), "", "")
	if code != 200 || !strings.Contains(body, "<code>OldTopicId</code>") {
		t.Fatalf("dead letter page: %d, does not name the log:\n%s", code, body)
	}
	code, body = call(t, c, "GET", srv.URL+"/api/partitions/history?group=g&topic=orders&partition=0&window=10m", f.token, "")
	var hist []Sample
	if err := json.Unmarshal([]byte(body), &hist); code != 200 || err != nil || len(hist) != 3 {
		t.Fatalf("history: %d %v, %d samples:\n%s", code, err, len(hist), body)
	}
	if hist[1].Rate < 0.9 || hist[1].Rate > 1.1 || hist[2].Rate != 0 || hist[2].TopicID != "NewTopicId" {
		t.Fatalf("rates %v, %v (log %q): want about 1 record/s in the old log and none across the adoption", hist[1].Rate, hist[2].Rate, hist[2].TopicID)
	}
}
