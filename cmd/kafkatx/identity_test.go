package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "Kafka's side of the history": a topic drained, deleted and created again under the
// same name, refilled with more records than the watermark. offsets status names the change
// (log_changed, exit 9, both topic ids), skip and replay are refused on it, and offsets reset
// --mode adopt --to-earliest moves onto the new log: every new record applied, an audit row
// of its own kind naming both ids, the account starting again in the new log.
func TestOffsetsResetAdoptsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	old := make([]string, 10)
	for i := range old {
		old[i] = "old"
	}
	b.produce(old...)
	b.runUntil(10)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	fresh := make([]string, 15)
	for i := range fresh {
		fresh[i] = "new"
	}
	b.produce(fresh...)

	s, code := b.status()
	if code != offsetsExitLogChanged || s.State != offsetstate.LogChanged || s.Log == nil {
		t.Fatalf("offsets status: exit %d, state %s; want %d, log_changed", code, s.State, offsetsExitLogChanged)
	}
	oldID, newID := s.Log.RecordedTopicID, s.Log.TopicID
	if oldID == "" || newID == "" || oldID == newID || s.Log.ClusterID != s.Log.RecordedClusterID {
		t.Fatalf("offsets status log %+v: want two topic ids and one cluster", *s.Log)
	}
	// The id is the one Kafka's own kafka-topics prints (scripts/kafka-topics, from the dev jars).
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	desc, err := exec.Command(filepath.Join(root, "scripts", "kafka-topics"), "--bootstrap-server", b.brokers, "--describe", "--topic", b.topic).CombinedOutput()
	if err != nil || !strings.Contains(string(desc), "TopicId: "+newID+"\t") {
		t.Fatalf("kafka-topics --describe (%v) does not print TopicId %s:\n%s", err, newID, desc)
	}
	text, _ := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic)
	for _, want := range []string{"log_changed", oldID, newID, "--mode adopt --to-earliest"} {
		if !strings.Contains(text, want) {
			t.Errorf("offsets status text does not say %q", want)
		}
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-latest", "--mode", "skip", "--reason", "x", "--execute"); code != 1 {
		t.Fatalf("a skip on a changed log exited %d, want 1 (refused)", code)
	}
	out, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "adopt", "--reason", "topic recreated in staging")
	if code != 0 || !strings.Contains(out, "log_adopted") || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run exited %d:\n%s", code, out)
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "adopt", "--reason", "topic recreated in staging", "--execute"); code != 0 {
		t.Fatalf("adopt exited %d", code)
	}
	var adopted []offsetstore.Event
	for _, e := range b.audit() {
		if e.Kind == offsetstore.KindLogAdopted {
			adopted = append(adopted, e)
		}
	}
	if len(adopted) != 1 || adopted[0].From != 10 || adopted[0].To != 0 || adopted[0].Status != offsets.StatusApplied ||
		!strings.Contains(adopted[0].Reason, oldID) || !strings.Contains(adopted[0].Reason, newID) || !strings.Contains(adopted[0].Reason, "topic recreated in staging") {
		t.Fatalf("log_adopted audit rows %+v: want one, applied, [10, 0), naming both topic ids and the reason", adopted)
	}
	// The move between two logs is rendered as one, not as the range "[10, 0)" (backwards).
	for _, args := range [][]string{{"offsets", "audit", "--group", b.group}, {"offsets", "status", "--group", b.group, "--topic", b.topic}} {
		out, _ := b.kafkatx(args...)
		if !strings.Contains(out, "log_adopted 10 of the old log -> 0 of the new") && !strings.Contains(out, "10 of the old log -> 0 of the new") {
			t.Errorf("kafkatx %q does not render the adoption as a move between logs:\n%s", args, out)
		}
		if strings.Contains(out, "[10, 0)") {
			t.Errorf("kafkatx %q renders the adoption as the range [10, 0):\n%s", args, out)
		}
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "adopt", "--reason", "again"); code != 1 {
		t.Fatalf("adopting an unchanged log exited %d, want 1 (refused)", code)
	}

	b.runUntil(15)
	if n := b.q("SELECT sum(applied) FROM {{schema}}.effects"); n != 25 {
		t.Fatalf("%d applications, want 10 of the old topic + 15 of the new", n)
	}
	if s, code := b.status(); code != 0 || s.State != offsetstate.Aligned {
		t.Fatalf("after the adoption offsets status exits %d (%s), want 0 aligned", code, s.State)
	}
	out, code = b.kafkatx("offsets", "account", "--group", b.group, "--topic", b.topic)
	if code != 0 || !strings.Contains(out, "offsets [0, 15)") || !strings.Contains(out, "new log since") {
		t.Fatalf("offsets account exited %d:\n%s", code, out)
	}
	if n := b.q("SELECT count(*) FROM {{schema}}.offset_audit WHERE kind = 'unexplained_move'"); n != 0 {
		t.Fatal("the adoption was reported as an unexplained watermark move")
	}
}

// A watermark of the old log is not subtracted from the new log's end: before, a topic
// recreated with fewer records than the watermark showed a negative lag (4 - 10 = -6).
// offsets status gives the new log's records (log end - log start), marked "(new log)", no
// drift; --mode adopt opens no replay epoch (business keys claimed in the old log still count).
func TestOffsetsStatusGivesNoLagAcrossTwoLogs(t *testing.T) {
	t.Parallel()
	b := offsetsSetup(t)
	b.produce("a", "a", "a", "a", "a", "a", "a", "a", "a", "a")
	b.runUntil(10)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	b.produce("b", "b", "b", "b")

	s, code := b.status()
	if code != offsetsExitLogChanged || s.State != offsetstate.LogChanged {
		t.Fatalf("offsets status: exit %d, state %s; want %d, log_changed", code, s.State, offsetsExitLogChanged)
	}
	if s.Lag != 4 || s.Drift != nil {
		t.Fatalf("log_changed partition: lag %d, drift %v; want 4 (the new log's records) and no drift", s.Lag, s.Drift)
	}
	text, _ := b.kafkatx("offsets", "status", "--group", b.group, "--topic", b.topic)
	// "-6" as a column of its own: a topic id (base64url) may hold "-6" (it did: a flaky run).
	if !strings.Contains(text, "4 (new log)") || regexp.MustCompile(`(^|\s)-6(\s|$)`).MatchString(text) {
		t.Fatalf("offsets status text does not give the new log's 4 records as its lag:\n%s", text)
	}
	if _, code := b.kafkatx("offsets", "reset", "--group", b.group, "--topic", b.topic, "--to-earliest", "--mode", "adopt", "--reason", "recreated", "--execute"); code != 0 {
		t.Fatalf("adopt exited %d", code)
	}
	if e := b.q("SELECT replay_epoch FROM {{schema}}.watermarks"); e != 0 {
		t.Fatalf("replay epoch %d after offsets reset --mode adopt, want 0: an adoption is no replay", e)
	}
}
