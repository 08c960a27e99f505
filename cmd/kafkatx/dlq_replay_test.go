package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Issue "liveness" 5: after `offsets reset --mode replay`, a message that failed again was
// counted in the logs and metrics, but its dead_letters row kept its old attempts and last
// failure, a row marked replayed stayed replayed, and no new dead-letter record was written.
// Now the row is updated (attempts, last failure, status new, the replay epoch) and a new
// record goes to the dead-letter topic through the outbox; `dlq list` shows it.
func TestDeadLetterAfterAReplayUpdatesItsRowAndIsPublishedAgain(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a", "bad", "c")
	b.runUntil(3)
	dlqRecords := func() int64 {
		return b.q(`SELECT count(*) FROM {{schema}}.outbox WHERE topic = $1`, b.topic+".dlq")
	}
	if n := dlqRecords(); n != 1 {
		t.Fatalf("%d dead-letter records in the outbox, want 1", n)
	}
	// An operator replayed it once (a row marked replayed) and its count was 7.
	b.q(`WITH u AS (UPDATE {{schema}}.dead_letters SET status = 'replayed', resolved_at = now(), attempts = 7,
		last_failure_at = now() - interval '1 hour' RETURNING 1) SELECT count(*) FROM u`)
	before := time.Now()
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "replay",
		"--reason", "re-run after a fix", "--execute"); code != 0 {
		t.Fatalf("offsets reset exited %d", code)
	}
	b.runUntil(3)
	if n := b.q(`SELECT count(*) FROM {{schema}}.dead_letters`); n != 1 {
		t.Fatalf("%d dead-letter rows, want the one row updated", n)
	}
	if n := b.q(`SELECT count(*) FROM {{schema}}.dead_letters WHERE "offset" = 1 AND status = 'new' AND resolved_at IS NULL
		AND attempts = 1 AND replay_epoch = 1 AND last_failure_at >= $1`, before.Add(-time.Second)); n != 1 {
		t.Fatal("the dead letter of the replayed message was not updated (status new, attempts 1, replay epoch 1, last failure now)")
	}
	if n := dlqRecords(); n != 2 {
		t.Fatalf("%d dead-letter records in the outbox after the replay, want 2 (one per failure)", n)
	}
	out, code := b.kafkatx("dlq", "list", "--output", "json")
	if code != 0 {
		t.Fatalf("dlq list exited %d", code)
	}
	var got struct {
		Status      string `json:"status"`
		Attempts    int    `json:"attempts"`
		ReplayEpoch int    `json:"replay_epoch"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &got); err != nil {
		t.Fatalf("dlq list: %q: %v", out, err)
	}
	if got.Status != "new" || got.Attempts != 1 || got.ReplayEpoch != 1 {
		t.Fatalf("dlq list shows %+v", got)
	}
}
