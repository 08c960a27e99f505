package idempotency_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/idempotency"
)

// record is one Kafka record as recorded from a real connector (testdata/debezium-3.6.1,
// see its README.md for the connector settings).
type record struct {
	Topic  string          `json:"topic"`
	Offset int64           `json:"offset"`
	Key    json.RawMessage `json:"key"`
	Value  json.RawMessage `json:"value"`
}

func (r record) msg() idempotency.Message {
	m := idempotency.Message{Topic: r.Topic, Offset: r.Offset}
	if s := string(bytes.TrimSpace(r.Key)); s != "" && s != "null" {
		m.Key = r.Key
	}
	if s := string(bytes.TrimSpace(r.Value)); s != "" && s != "null" {
		m.Value = r.Value
	}
	return m
}

// ev decodes the record's value as an envelope map (for edits).
func (r record) ev(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	d := json.NewDecoder(bytes.NewReader(r.Value))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func recorded(t *testing.T, name string) []record {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "debezium-3.6.1", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var keyShape = regexp.MustCompile(`^dbz2:pg:rec:rec\.public\.[a-z_]+:(r:snap:(k[0-9a-f]{32}|-):a[0-9a-f]{32}|[cudtm]:[0-9]+:[0-9]*:(o[0-9]+|-):(k[0-9a-f]{32}|i[0-9a-f]{32}|m[0-9a-f]{32}|-))$|^dbz2:pg:rec:rec\.\.:m:`)

// TestFromDebeziumRealStream: every record a real connector wrote for a mixed workload
// (snapshot, insert, update, delete, primary-key update, multi-row INSERT, COPY, a
// multi-statement transaction, TOAST, a keyless table, logical messages, truncate, with
// transaction metadata and heartbeats on) gets either a key or ErrNotAChange, and no two
// changes share a key.
func TestFromDebeziumRealStream(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	seen := map[string]record{}
	var changes, notChanges int
	for _, r := range recorded(t, "stream.jsonl") {
		k, ok, err := f(r.msg())
		wantNot := r.msg().Value == nil || strings.HasSuffix(r.Topic, ".transaction") || strings.HasPrefix(r.Topic, "__debezium-heartbeat")
		if wantNot {
			if !errors.Is(err, idempotency.ErrNotAChange) || ok {
				t.Errorf("%s@%d: key %q ok=%v err=%v; want ErrNotAChange", r.Topic, r.Offset, k, ok, err)
			}
			notChanges++
			continue
		}
		if err != nil || !ok {
			t.Fatalf("%s@%d: ok=%v err=%v", r.Topic, r.Offset, ok, err)
		}
		if !keyShape.MatchString(k) {
			t.Errorf("%s@%d: key %q has not the documented shape", r.Topic, r.Offset, k)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("%s@%d and %s@%d share key %q", prev.Topic, prev.Offset, r.Topic, r.Offset, k)
		}
		seen[k] = r
		changes++
	}
	// items: 3 snapshot rows and 16 changes; kl: 7 changes and a truncate; 2 messages.
	if changes != 3+16+8+2 || notChanges == 0 {
		t.Errorf("%d changes, %d not changes", changes, notChanges)
	}
}

// TestFromDebeziumConverterSettings: the key does not depend on whether the JSON converter
// wraps the record key or the value in {"schema", "payload"}.
func TestFromDebeziumConverterSettings(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	n := 0
	for _, r := range recorded(t, "stream.jsonl") {
		m := r.msg()
		k1, _, err := f(m)
		if err != nil {
			continue
		}
		var wrapped map[string]json.RawMessage
		if m.Key != nil {
			if err := json.Unmarshal(m.Key, &wrapped); err != nil || wrapped["payload"] == nil {
				t.Fatalf("%s@%d: recorded key is not schema-wrapped: %s", r.Topic, r.Offset, m.Key)
			}
			m.Key = []byte(" " + string(wrapped["payload"]))
		}
		m.Value = mustJSON(t, map[string]any{"schema": map[string]any{"type": "struct"}, "payload": json.RawMessage(m.Value)})
		k2, _, err := f(m)
		if err != nil || k2 != k1 {
			t.Errorf("%s@%d: key %q with schemas swapped, %q as recorded (err %v)", r.Topic, r.Offset, k2, k1, err)
		}
		n++
	}
	if n < 29 {
		t.Fatalf("only %d records compared", n)
	}
}

// TestFromDebeziumCopyRows: the rows of one COPY share lsn, txId and sequence; their keys
// still differ (issue: 709 of 1,980 changes were lost when they did not). Without
// transaction metadata, too.
func TestFromDebeziumCopyRows(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	keys := map[string]bool{}
	var lsns = map[string]bool{}
	for _, r := range recorded(t, "stream.jsonl") {
		if r.Topic != "rec.public.items" || r.msg().Value == nil {
			continue
		}
		v := r.ev(t)
		after, _ := v["after"].(map[string]any)
		if after == nil || after["name"] == nil || !strings.HasPrefix(after["name"].(string), "c2") {
			continue
		}
		src := v["source"].(map[string]any)
		lsns[string(src["lsn"].(json.Number))+"/"+src["sequence"].(string)] = true
		delete(v, "transaction")
		k, _, err := f(idempotency.Message{Key: r.Key, Value: mustJSON(t, v)})
		if err != nil {
			t.Fatal(err)
		}
		keys[k] = true
	}
	if len(lsns) != 1 || len(keys) != 3 {
		t.Fatalf("COPY of 3 rows: %d positions (want 1, as recorded), %d keys (want 3)", len(lsns), len(keys))
	}
}

// TestFromDebeziumKeyless: a keyless table (REPLICA IDENTITY FULL, record key null). With
// transaction metadata, identical rows of one COPY get distinct keys; without it they share
// one: the documented limit.
func TestFromDebeziumKeyless(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	var with, without []string
	for _, r := range recorded(t, "stream.jsonl") {
		if r.Topic != "rec.public.kl" || r.msg().Value == nil {
			continue
		}
		v := r.ev(t)
		if v["op"] != "c" {
			continue
		}
		k, _, err := f(r.msg())
		if err != nil {
			t.Fatal(err)
		}
		with = append(with, k)
		delete(v, "transaction")
		k, _, err = f(idempotency.Message{Value: mustJSON(t, v)})
		if err != nil {
			t.Fatal(err)
		}
		without = append(without, k)
	}
	if len(with) != 5 {
		t.Fatalf("%d keyless creates recorded, want 5", len(with))
	}
	distinct := func(ks []string) int {
		m := map[string]bool{}
		for _, k := range ks {
			m[k] = true
		}
		return len(m)
	}
	if d := distinct(with); d != 5 {
		t.Errorf("with transaction metadata: %d distinct keys of 5 rows: %q", d, with)
	}
	// COPY (1,same),(1,same),(2,other): one WAL record, so the two identical rows collide;
	// the INSERT … VALUES rows have LSNs of their own.
	if without[0] != without[1] || without[0] == without[2] || without[3] == without[4] || distinct(without) != 4 {
		t.Errorf("without transaction metadata: keys %q; want only the identical COPY rows to share one", without)
	}
}

// TestFromDebeziumSnapshots: snapshot reads are keyed by the row's identity and content, not
// by the snapshot's position: the same row read by an interrupted snapshot and its restart
// (other lsn, txId, snapshot marker), or by a later incremental snapshot (lsn and txId
// null), gets one key; a changed row, another row, or a streamed change of the row gets
// another.
func TestFromDebeziumSnapshots(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	key := func(k []byte, v map[string]any) string {
		t.Helper()
		s, ok, err := f(idempotency.Message{Key: k, Value: mustJSON(t, v)})
		if err != nil || !ok {
			t.Fatalf("ok=%v err=%v", ok, err)
		}
		return s
	}
	inc := recorded(t, "incremental.jsonl")
	var incRows []record
	for _, r := range inc {
		if r.Topic == "rec.public.big" {
			incRows = append(incRows, r)
		}
	}
	if len(incRows) != 5 {
		t.Fatalf("%d incremental rows recorded", len(incRows))
	}
	keys := map[string]bool{}
	for _, r := range incRows {
		v := r.ev(t)
		src := v["source"].(map[string]any)
		if src["snapshot"] != "incremental" || src["lsn"] != nil || src["txId"] != nil {
			t.Fatalf("recorded incremental row has source %v", src)
		}
		k := key(r.Key, v)
		keys[k] = true
		// The same row read by an initial snapshot restarted after a crash.
		src["snapshot"], src["lsn"], src["txId"], src["sequence"] = "true", json.Number("987654"), json.Number("901"), `[null,"987654"]`
		v["ts_ms"] = json.Number("1")
		if again := key(r.Key, v); again != k {
			t.Errorf("row %s: snapshot restart key %q, first read %q", r.Key, again, k)
		}
		// The same row, changed, read by a second snapshot.
		v["after"].(map[string]any)["v"] = "changed"
		if changed := key(r.Key, v); changed == k {
			t.Errorf("row %s: changed row kept its snapshot key", r.Key)
		}
		// A streamed update of the row.
		v["op"] = "u"
		if streamed := key(r.Key, v); streamed == k || !strings.Contains(streamed, ":u:987654:901:") {
			t.Errorf("row %s: streamed update key %q (snapshot key %q)", r.Key, streamed, k)
		}
	}
	if len(keys) != 5 {
		t.Errorf("5 rows of one incremental snapshot got %d keys", len(keys))
	}
	// The initial snapshot's rows in stream.jsonl: one key each, of the snapshot form.
	n := 0
	for _, r := range recorded(t, "stream.jsonl") {
		if r.Topic == "rec.public.items" && bytes.Contains(r.Value, []byte(`"op":"r"`)) {
			k, _, err := f(r.msg())
			if err != nil || !strings.Contains(k, ":r:snap:k") {
				t.Errorf("initial snapshot row %s: %q %v", r.Key, k, err)
			}
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d initial snapshot rows", n)
	}
}

// TestFromDebeziumResentAfterKill: changes a real connector re-sent after a kill -9 of
// Kafka Connect (at new Kafka offsets, inside one 150,000-row transaction, with
// transaction metadata on) get the key of their first copy; different rows differ.
func TestFromDebeziumResentAfterKill(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	byRow := map[string][]string{}
	for _, r := range recorded(t, "resent_after_kill.jsonl") {
		v := r.ev(t)
		row := string(mustJSON(t, v["after"]))
		k, _, err := f(r.msg())
		if err != nil {
			t.Fatal(err)
		}
		byRow[row] = append(byRow[row], k)
	}
	all := map[string]bool{}
	for row, ks := range byRow {
		if len(ks) != 2 || ks[0] != ks[1] {
			t.Errorf("row %s: keys %q; want two equal", row, ks)
		}
		all[ks[0]] = true
	}
	if len(byRow) != 40 || len(all) != 40 {
		t.Errorf("%d rows, %d keys; want 40 and 40", len(byRow), len(all))
	}
}

// TestFromDebeziumNotAChange: records that carry no change give ErrNotAChange, never a key
// and never another error.
func TestFromDebeziumNotAChange(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	for name, v := range map[string]string{
		"tombstone":              ``,
		"JSON null value":        `null`,
		"tombstone with schema":  `{"schema":{"type":"struct"},"payload":null}`,
		"heartbeat":              `{"ts_ms":1796138338476}`,
		"transaction begin":      `{"status":"BEGIN","id":"744:30950896","event_count":null,"data_collections":null,"ts_ms":1796138346232}`,
		"transaction end schema": `{"schema":{"type":"struct"},"payload":{"status":"END","id":"744:30951080","event_count":1,"data_collections":[{"data_collection":"public.items","event_count":1}],"ts_ms":1}}`,
		"schema change":          `{"source":{"connector":"mysql","name":"s","file":"b.000003","pos":154},"databaseName":"inventory","ddl":"CREATE TABLE t (id INT)","tableChanges":[]}`,
	} {
		k, ok, err := f(idempotency.Message{Key: []byte(`{"serverName":"rec"}`), Value: []byte(v)})
		if !errors.Is(err, idempotency.ErrNotAChange) || ok || k != "" {
			t.Errorf("%s: %q ok=%v err=%v; want ErrNotAChange", name, k, ok, err)
		}
	}
}

func TestFromDebeziumRefuses(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	for name, v := range map[string][]byte{
		"not json":        []byte("poison \x00\xff"),
		"op, no source":   []byte(`{"before":null,"after":{"id":1},"op":"c"}`),
		"pg without lsn":  []byte(`{"after":{"id":1},"source":{"connector":"postgresql","txId":5},"op":"c"}`),
		"unknown op":      []byte(`{"after":{"id":1},"source":{"connector":"postgresql","lsn":5,"txId":5},"op":"x"}`),
		"snapshot no row": []byte(`{"after":null,"source":{"connector":"postgresql","lsn":5},"op":"r"}`),
		"mongodb":         sample(t, "mongodb_create.json"),
		"array":           []byte(`[1,2]`),
		"unknown connect": []byte(`{"source":{"connector":"cassandra"},"op":"c"}`),
	} {
		k, ok, err := f(idempotency.Message{Key: []byte(`{"id":1}`), Value: v})
		if err == nil || ok || errors.Is(err, idempotency.ErrNotAChange) {
			t.Errorf("%s: %q ok=%v err=%v; want an error other than ErrNotAChange", name, k, ok, err)
		}
	}
}

// TestFromDebeziumFormat pins the key format (a change would re-key every claim: a new
// format needs a new prefix and an upgrade note).
func TestFromDebeziumFormat(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	cases := []struct{ file, recordKey, want string }{
		{"pg_create_with_schema.json", `{"id":1}`, "dbz2:pg:PostgreSQL_server:postgres.public.customers:c:24023128:555:-:k"},
		{"pg_update.json", `{"schema":{"type":"struct"},"payload":{"id":1}}`, "dbz2:pg:PostgreSQL_server:postgres.public.customers:u:24023196:556:-:k"},
		{"mysql_create.json", `{"id":1004}`, "dbz2:mysql:mysql-server-1:inventory.customers:c:223344:mysql-bin.000003:154:0:-:k"},
		{"sqlserver_create.json", `{"id":1005}`, "dbz2:sqlserver:server1:testDB.dbo.customers:c:00000027:00000758:0005:00000027:00000758:0003:1:-:k"},
		{"pg_snapshot_1.json", `{"id":1001}`, "dbz2:pg:"},
	}
	for _, c := range cases {
		k, ok, err := f(idempotency.Message{Key: []byte(c.recordKey), Value: sample(t, c.file)})
		if err != nil || !ok || !strings.HasPrefix(k, c.want) {
			t.Errorf("%s: key %q ok=%v err=%v; want prefix %q", c.file, k, ok, err, c.want)
		}
	}
	// {"id":1}: the digest is of the canonical payload, so these are one key.
	a, _, _ := f(idempotency.Message{Key: []byte(`{"id":1}`), Value: sample(t, "pg_update.json")})
	b, _, _ := f(idempotency.Message{Key: []byte(`{"payload":{"id":1},"schema":{"type":"struct","fields":[]}}`), Value: sample(t, "pg_update.json")})
	const want = "dbz2:pg:PostgreSQL_server:postgres.public.customers:u:24023196:556:-:k037c9214eef74cc3887f3a4f085b4e17"
	if a != b || a != want {
		t.Errorf("keys %q and %q; want both %q", a, b, want)
	}
}

// TestFromDebeziumDistinct: events that share a source position (a primary-key update's
// delete and create, a TRUNCATE of two tables, snapshot rows, two rows of one binlog event)
// get distinct keys, and the same event always gets the same key.
func TestFromDebeziumDistinct(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	key := func(file, recordKey string) string {
		k, ok, err := f(idempotency.Message{Key: []byte(recordKey), Value: sample(t, file)})
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", file, ok, err)
		}
		return k
	}
	pairs := [][4]string{
		{"pg_pk_update_delete.json", `{"id":1}`, "pg_pk_update_create.json", `{"id":2}`},
		{"pg_truncate_a.json", ``, "pg_truncate_b.json", ``},
		{"pg_snapshot_1.json", `{"id":1001}`, "pg_snapshot_2.json", `{"id":1002}`},
		{"mysql_create.json", `{"id":1004}`, "mysql_create_row1.json", `{"id":1005}`},
	}
	for _, p := range pairs {
		a, b := key(p[0], p[1]), key(p[2], p[3])
		if a == b {
			t.Errorf("%s and %s share key %q", p[0], p[2], a)
		}
		if again := key(p[0], p[1]); again != a {
			t.Errorf("%s: key not deterministic: %q then %q", p[0], a, again)
		}
	}
}

// TestDebeziumPositionFirstFormat: Position keeps the first key format byte for byte.
func TestDebeziumPositionFirstFormat(t *testing.T) {
	t.Parallel()
	cases := []struct{ file, recordKey, want string }{
		{"pg_create_with_schema.json", `{"id":1}`, "pg:PostgreSQL_server:postgres.public.customers:c:24023128:555"},
		{"pg_update.json", `{"id":1}`, "pg:PostgreSQL_server:postgres.public.customers:u:24023196:556"},
		{"acceptance_event.json", `{"id":7}`, "pg::app.public.customers:c:100448:707"},
		{"mysql_create.json", `{"id":1004}`, "mysql:mysql-server-1:inventory.customers:c:223344:mysql-bin.000003:154:0"},
		{"sqlserver_create.json", `{"id":1005}`, "sqlserver:server1:testDB.dbo.customers:c:00000027:00000758:0005:00000027:00000758:0003:1"},
		{"pg_snapshot_1.json", `{"id":1001}`, "pg:PostgreSQL_server:postgres.public.customers:r:24000000:540:snap:"},
	}
	for _, c := range cases {
		ev, err := idempotency.ParseDebezium(sample(t, c.file))
		if err != nil {
			t.Fatal(err)
		}
		k, err := ev.Position([]byte(c.recordKey))
		if err != nil || !strings.HasPrefix(k, c.want) {
			t.Errorf("%s: %q %v; want %q", c.file, k, err, c.want)
		}
	}
}

// TestWithoutUnavailable: the TOAST placeholder a real connector sent for an unchanged
// TOASTed column is removed from the row, and named; a delete's before image under the
// default replica identity keeps only the key's columns.
func TestWithoutUnavailable(t *testing.T) {
	t.Parallel()
	var upd, del record
	for _, r := range recorded(t, "stream.jsonl") {
		if r.Topic == "rec.public.items" && bytes.Contains(r.Value, []byte(idempotency.UnavailableValue)) {
			upd = r
		}
		if r.Topic == "rec.public.items" && bytes.Contains(r.Value, []byte(`"op":"d"`)) && del.Value == nil {
			del = r
		}
	}
	ev, err := idempotency.ParseDebezium(upd.Value)
	if err != nil {
		t.Fatal(err)
	}
	row, gone, err := idempotency.WithoutUnavailable(ev.After)
	if err != nil || len(gone) != 1 || gone[0] != "body" || bytes.Contains(row, []byte("__debezium")) || !bytes.Contains(row, []byte(`"qty":9`)) {
		t.Errorf("WithoutUnavailable = %s %q %v", row, gone, err)
	}
	for _, v := range []string{`{"a":["__debezium_unavailable_value"],"b":"X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==","c":"x"}`} {
		row, gone, err := idempotency.WithoutUnavailable(json.RawMessage(v))
		if err != nil || strings.Join(gone, ",") != "a,b" || string(row) != `{"c":"x"}` {
			t.Errorf("WithoutUnavailable(%s) = %s %q %v", v, row, gone, err)
		}
	}
	ev, err = idempotency.ParseDebezium(del.Value)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(ev.Before, []byte(`"name":""`)) {
		t.Fatalf("recorded delete's before %s lacks the placeholder values", ev.Before)
	}
	kc, ok, err := idempotency.KeyColumns(ev.Before, del.Key)
	if err != nil || !ok || string(kc) != `{"id":10}` {
		t.Errorf("KeyColumns = %s %v %v", kc, ok, err)
	}
	if _, ok, _ := idempotency.KeyColumns(ev.Before, nil); ok {
		t.Error("KeyColumns without a record key reported key columns")
	}
}

// TestFromDebeziumSnapshotRestartedReal: rows a real connector read three times — by an
// initial snapshot killed half-way (SIGKILL of Connect), by its restart (new lsn and txId),
// and by a later incremental snapshot of the unchanged table (lsn and txId null) — get one
// key per row; different rows get different keys.
func TestFromDebeziumSnapshotRestartedReal(t *testing.T) {
	t.Parallel()
	f := idempotency.FromDebezium()
	byID := map[string][]string{}
	positions := map[string]map[string]bool{}
	for _, r := range recorded(t, "snapshot_restarted.jsonl") {
		k, ok, err := f(r.msg())
		if err != nil || !ok {
			t.Fatalf("%s@%d: %v", r.Topic, r.Offset, err)
		}
		id := string(r.Key)
		byID[id] = append(byID[id], k)
		src := r.ev(t)["source"].(map[string]any)
		if positions[id] == nil {
			positions[id] = map[string]bool{}
		}
		positions[id][fmt.Sprint(src["lsn"], "/", src["txId"], "/", src["snapshot"])] = true
	}
	keys := map[string]bool{}
	for id, ks := range byID {
		if len(positions[id]) != len(ks) || len(ks) < 2 {
			t.Fatalf("row %s: %d reads at %d positions; the recording should hold 2 or 3 reads at distinct positions", id, len(ks), len(positions[id]))
		}
		for _, k := range ks[1:] {
			if k != ks[0] {
				t.Errorf("row %s: keys %q; want one", id, ks)
			}
		}
		keys[ks[0]] = true
	}
	if len(byID) != 15 || len(keys) != 15 {
		t.Errorf("%d rows, %d keys; want 15 and 15", len(byID), len(keys))
	}
}
