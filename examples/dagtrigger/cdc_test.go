package main

// Tests against a real Debezium PostgreSQL connector on Kafka Connect (scripts/dev-services
// up connect; make test starts it). Each counts every change made to the source tables
// against ground truth kept by triggers on them (an audit table), for two consumers:
// a plain kafkatx consumer with idempotency.FromDebezium whose handler records one applied
// change per event, and this example (one DAG run per event, against the recording
// Airflow stand-in). Expected: exactly one effect per source change, re-sent and re-read
// copies absorbed, nothing dead-lettered.
//
// They are not parallel: two of them kill the Connect worker with SIGKILL.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/internal/cdctest"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// auditSQL keeps the ground truth: one audit row per change event Debezium must emit for
// a row change (a primary-key update is a delete and a create), one per TRUNCATE. Rows are
// named by id, or for keyless tables by "a:b".
const auditSQL = `
CREATE TABLE audit (n bigserial PRIMARY KEY, tbl text NOT NULL, op text NOT NULL, row_id text NOT NULL);
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE o text; n text;
BEGIN
  IF TG_ARGV[0] = 'id' THEN
    IF TG_OP <> 'INSERT' THEN o := OLD.id::text; END IF;
    IF TG_OP <> 'DELETE' THEN n := NEW.id::text; END IF;
  ELSE
    IF TG_OP <> 'INSERT' THEN o := OLD.a::text || ':' || OLD.b; END IF;
    IF TG_OP <> 'DELETE' THEN n := NEW.a::text || ':' || NEW.b; END IF;
  END IF;
  IF TG_OP = 'INSERT' THEN
    INSERT INTO audit (tbl, op, row_id) VALUES (TG_TABLE_NAME, 'c', n);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO audit (tbl, op, row_id) VALUES (TG_TABLE_NAME, 'd', o);
  ELSIF TG_ARGV[0] = 'id' AND o <> n THEN
    INSERT INTO audit (tbl, op, row_id) VALUES (TG_TABLE_NAME, 'd', o), (TG_TABLE_NAME, 'c', n);
  ELSE
    INSERT INTO audit (tbl, op, row_id) VALUES (TG_TABLE_NAME, 'u', n);
  END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION audit_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO audit (tbl, op, row_id) VALUES (TG_TABLE_NAME, 't', ''); RETURN NULL; END $$;
CREATE TABLE applied (n bigserial PRIMARY KEY, tbl text NOT NULL, op text NOT NULL, row_id text NOT NULL, key text NOT NULL);
CREATE TABLE debezium_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
`

// audited adds the audit triggers to table (idCol "id" or "ab" for keyless (a, b) tables).
func audited(t *testing.T, pool *pgxpool.Pool, table, idCol string) {
	t.Helper()
	sqlExec(t, pool, fmt.Sprintf(`CREATE TRIGGER %[1]s_audit AFTER INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION audit_row('%[2]s');
		CREATE TRIGGER %[1]s_audit_t AFTER TRUNCATE ON %[1]s FOR EACH STATEMENT EXECUTE FUNCTION audit_truncate()`, table, idCol))
}

func sqlExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%.200s: %v", sql, err)
	}
}

// rig is one test's source database, connector and plain consumer.
type rig struct {
	t       *testing.T
	dsn     string
	pool    *pgxpool.Pool
	brokers string
	prefix  string
	conn    *cdctest.Connector

	consumer *kafkatx.Consumer
	stop     func()
}

func newRig(t *testing.T) *rig {
	cdctest.ConnectURL(t)
	r := &rig{t: t, brokers: testenv.Brokers(t), dsn: testenv.Database(t)}
	var err error
	r.pool, err = pgxpool.New(context.Background(), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	r.prefix = strings.ReplaceAll(testenv.UniqueName(t, "cdc_", 40), "-", "_")
	sqlExec(t, r.pool, auditSQL)
	if err := kafkatx.Migrate(context.Background(), r.pool, "kafkatx"); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) topic(table string) string { return r.prefix + ".public." + table }

// startConnector registers the connector for tables (schema-qualified) with extra settings.
func (r *rig) startConnector(extra map[string]string, tables ...string) {
	cfg := cdctest.Config(r.t, r.dsn, r.prefix, tables...)
	cfg["signal.data.collection"] = "public.debezium_signal"
	maps.Copy(cfg, extra)
	start := time.Now()
	r.conn = cdctest.Start(r.t, r.dsn, r.prefix, cfg)
	r.t.Logf("connector %s running after %s", r.prefix, time.Since(start).Round(time.Millisecond))
}

// startConsumer runs a plain kafkatx consumer with idempotency.FromDebezium over topics; its
// handler records each change it is given in applied, in the consumer's transaction.
func (r *rig) startConsumer(topics ...string) {
	t := r.t
	for _, tp := range topics {
		cdctest.WaitTopic(t, r.brokers, tp, 3*time.Minute)
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		ev, err := idempotency.ParseDebezium(m.Value)
		if err != nil {
			return err // not reached: FromDebezium already refused it
		}
		key, err := ev.Key(m.Key)
		if err != nil {
			return err
		}
		var table string
		_ = json.Unmarshal(ev.Source["table"], &table)
		_, err = tx.Exec(ctx, `INSERT INTO applied (tbl, op, row_id, key) VALUES ($1, $2, $3, $4)`, table, ev.Op, rowID(ev), key)
		return err
	}
	c, err := kafkatx.NewConsumer(r.pool, handler, &kafkatx.Config{
		Kafka:       kafka.ConfigMap{"bootstrap.servers": r.brokers, "group.id": testenv.Group(t)},
		Topics:      topics,
		Retry:       kafkatx.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		Idempotency: kafkatx.IdempotencyConfig{Key: idempotency.FromDebezium()},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	r.consumer = c
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				t.Errorf("consumer: %v", err)
			}
		})
	}
	t.Cleanup(r.stop)
}

// rowID names an event's row as the audit trigger does.
func rowID(ev *idempotency.DebeziumEvent) string {
	img := ev.After
	if ev.Op == "d" {
		img = ev.Before
	}
	var row map[string]any
	if json.Unmarshal(img, &row) != nil || row == nil {
		return ""
	}
	if id, ok := row["id"]; ok {
		return fmt.Sprint(id)
	}
	return fmt.Sprintf("%v:%v", row["a"], row["b"])
}

// counts returns "tbl op row_id" → count from audit or applied.
func (r *rig) counts(from string, tables ...string) map[string]int {
	rows, err := r.pool.Query(context.Background(), `SELECT tbl || ' ' || op || ' ' || row_id, count(*) FROM `+from+` WHERE tbl = ANY($1) GROUP BY 1`, tables)
	if err != nil {
		r.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (kv [2]any, err error) {
		var k string
		var n int
		err = row.Scan(&k, &n)
		return [2]any{k, n}, err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	m := map[string]int{}
	for _, kv := range out {
		m[kv[0].(string)] = kv[1].(int)
	}
	return m
}

func total(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

// waitApplied waits until applied holds exactly audit's changes of tables (one effect per
// source change), and a little longer to see nothing more arrive; it fails with the
// difference otherwise.
func (r *rig) waitApplied(timeout time.Duration, tables ...string) map[string]int {
	r.t.Helper()
	want := r.counts("audit", tables...)
	deadline := time.Now().Add(timeout)
	var got map[string]int
	for {
		got = r.counts("applied", tables...)
		if maps.Equal(got, want) {
			time.Sleep(2 * time.Second) // late copies would show up now
			if got = r.counts("applied", tables...); maps.Equal(got, want) {
				return want
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	var diff []string
	for _, k := range slices.Sorted(maps.Keys(merge(want, got))) {
		if want[k] != got[k] {
			diff = append(diff, fmt.Sprintf("%s: source %d, applied %d", k, want[k], got[k]))
		}
	}
	if len(diff) > 20 {
		diff = append(diff[:20], fmt.Sprintf("… %d more", len(diff)-20))
	}
	// Say which side is short: records not on the topics yet (the connector) or on the topics
	// and not applied (the consumer).
	var onTopics int64
	for _, tb := range tables {
		onTopics += cdctest.EndOffset(r.t, r.brokers, r.topic(tb))
	}
	var s kafkatx.Stats
	if r.consumer != nil {
		s = r.consumer.Stats()
	}
	r.t.Fatalf("applied changes (%d) differ from the source's (%d) after %s; records on the topics %d, consumer processed %d, duplicates %d, not changes %d, dead-lettered %d, in flight %d:\n%s",
		total(got), total(want), timeout, onTopics, s.Processed, s.Duplicates, s.NotChanges, s.DeadLettered, s.InFlight, strings.Join(diff, "\n"))
	return nil
}

func merge(a, b map[string]int) map[string]int {
	m := maps.Clone(a)
	for k, v := range b {
		m[k] += v
	}
	return m
}

// checkStats: nothing dead-lettered; every record on topics was applied once, absorbed as
// a copy, or skipped as not a change. Heartbeats keep arriving, so the records the consumer
// accounted for must lie between the topics' size before and after reading its stats.
func (r *rig) checkStats(effects int, topics ...string) kafkatx.Stats {
	r.t.Helper()
	records := func() (n int64) {
		for _, tp := range topics {
			n += cdctest.EndOffset(r.t, r.brokers, tp)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	var s kafkatx.Stats
	var before, after, seen int64
	for {
		before = records()
		s = r.consumer.Stats()
		after = records()
		seen = s.Processed + s.Duplicates + s.NotChanges
		if seen >= before || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Logf("records %d: processed %d, duplicates absorbed %d, not changes %d, dead-lettered %d", before, s.Processed, s.Duplicates, s.NotChanges, s.DeadLettered)
	if s.DeadLettered != 0 {
		r.t.Errorf("%d records dead-lettered", s.DeadLettered)
	}
	if s.Processed != int64(effects) || seen < before || seen > after {
		r.t.Errorf("processed %d (want %d) + duplicates %d + not changes %d = %d, want between %d and %d records", s.Processed, effects, s.Duplicates, s.NotChanges, seen, before, after)
	}
	return s
}

// runDAGTrigger runs this example over topic until idle, against the recording Airflow
// stand-in, and returns its summary and runs.
func runDAGTrigger(t *testing.T, r *rig, topic string, extra ...string) (map[string]int64, *fakeAirflow) {
	t.Helper()
	fake, url := newFake(t, 0)
	e := &env{bin: buildBinary(t), brokers: r.brokers, dbURL: r.dsn, topic: topic, group: testenv.Group(t), airflowURL: url, logDir: t.TempDir()}
	cmd, stdout := e.start(t, 1, append([]string{"--exit-when-idle", "3s", "--batch-size", "200"}, extra...)...)
	start := time.Now()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dagtrigger: %v (logs in %s)", err, e.logDir)
	}
	var sum map[string]int64
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("dagtrigger summary %q: %v", stdout.String(), err)
	}
	t.Logf("dagtrigger over %s in %s: %v", topic, time.Since(start).Round(time.Millisecond), sum)
	return sum, fake
}

// checkRuns: one created run per expected event (ops c, u, d, r of the audit), none twice,
// no conf carrying a Debezium placeholder.
func checkRuns(t *testing.T, fake *fakeAirflow, sum map[string]int64, want map[string]int) {
	t.Helper()
	n := 0
	for k, v := range want {
		if op := strings.Fields(k)[1]; op != "t" {
			n += v
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.bad != 0 {
		t.Errorf("%d malformed requests", fake.bad)
	}
	for id, c := range fake.creates {
		if c != 1 {
			t.Errorf("run %s created %d times", id, c)
		}
	}
	for id, conf := range fake.runs {
		if strings.Contains(string(conf), idempotency.UnavailableValue) {
			t.Errorf("run %s: conf %s carries the TOAST placeholder", id, conf)
		}
	}
	if len(fake.runs) != n || sum["runs_created"] != int64(n) || sum["dead_lettered"] != 0 {
		t.Errorf("%d runs (summary: %d created, %d dead-lettered), want %d: one per source change", len(fake.runs), sum["runs_created"], sum["dead_lettered"], n)
	}
}

// TestCDCStreamingWithKill: an initial snapshot, then every kind of row change — insert,
// update, delete, primary-key update, multi-row INSERT … VALUES, a 500-row COPY, a
// transaction of several changes, an update leaving a TOASTed column alone — then writes
// that go on while the Connect worker is killed with SIGKILL and restarted, then TRUNCATE.
func TestCDCStreamingWithKill(t *testing.T) {
	r := newRig(t)
	sqlExec(t, r.pool, `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0, body text)`)
	sqlExec(t, r.pool, `INSERT INTO items (id, name) SELECT g, 'snap' || g FROM generate_series(1, 300) g`)
	audited(t, r.pool, "items", "id")
	sqlExec(t, r.pool, `INSERT INTO audit (tbl, op, row_id) SELECT 'items', 'r', id::text FROM items`) // the snapshot's truth
	r.startConnector(map[string]string{"skipped.operations": "none", "heartbeat.interval.ms": "500"}, "public.items")
	items, hb := r.topic("items"), "__debezium-heartbeat."+r.prefix
	r.startConsumer(items, hb)

	for _, sql := range []string{
		`INSERT INTO items (id, name) VALUES (1001, 'one')`,
		`UPDATE items SET qty = 7 WHERE id = 1001`,
		`UPDATE items SET qty = 8 WHERE id = 5`, // a snapshot row, changed: a new effect
		`DELETE FROM items WHERE id = 1001`,
		`UPDATE items SET id = 1300 WHERE id = 3`, // primary-key update: delete + create
		`INSERT INTO items (id, name) VALUES (1101, 'm'), (1102, 'm'), (1103, 'm'), (1104, 'm'), (1105, 'm')`,
		`BEGIN; INSERT INTO items (id, name) VALUES (1201, 'tx'); UPDATE items SET qty = 1 WHERE id = 1201;
		 INSERT INTO items (id, name) VALUES (1202, 'tx'); DELETE FROM items WHERE id = 10; COMMIT`,
		`INSERT INTO items (id, name, body) VALUES (1400, 'toast', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g))`,
		`UPDATE items SET qty = 9 WHERE id = 1400`, // body unchanged: Debezium sends the placeholder
	} {
		sqlExec(t, r.pool, sql)
	}
	// A 500-row COPY: one WAL record per batch of rows, so they share lsn, txId and sequence.
	conn, err := r.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var copyRows [][]any
	for i := range 500 {
		copyRows = append(copyRows, []any{2000 + i, "copy"})
	}
	if n, err := conn.Conn().CopyFrom(context.Background(), pgx.Identifier{"items"}, []string{"id", "name"}, pgx.CopyFromRows(copyRows)); err != nil || n != 500 {
		t.Fatalf("COPY: %d rows, %v", n, err)
	}
	conn.Release()
	// Kill Connect only once the COPY is through: a worker killed while it streams one
	// multi-insert WAL record resumes after the whole record and loses its unsent rows —
	// Debezium's own bug (debezium/dbz#1554: events sharing an LSN), upstream of any consumer;
	// seen here as 77 consecutive COPY rows never on the topic. docs/dag-triggered-services.md
	// says so.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var copied int
		if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM applied WHERE tbl = 'items' AND op = 'c' AND row_id IN (SELECT g::text FROM generate_series(2000, 2499) g)`).Scan(&copied); err != nil {
			t.Fatal(err)
		}
		if copied == 500 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of the 500 COPY rows applied after 3 min", copied)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Writes go on while the worker is killed with SIGKILL and restarted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	written := make(chan int, 1)
	go func() {
		defer wg.Done()
		i := 0
		defer func() { written <- i }()
		for ; ctx.Err() == nil; i++ {
			err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO items (id, name) VALUES ($1, 'w')`, 5000+i); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE items SET qty = qty + 1 WHERE id = $1`, 5000+i)
				return err
			})
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("writer: %v", err)
				}
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(3 * time.Second)
	before := cdctest.EndOffset(t, r.brokers, items)
	cdctest.KillWorker(t)
	t.Logf("Connect killed with SIGKILL after %d records on %s", before, items)
	time.Sleep(time.Second)
	start := time.Now()
	cdctest.StartWorker(t)
	r.conn.Register(t)
	t.Logf("Connect restarted and the connector running again after %s", time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	t.Logf("writer: %d insert+update transactions", <-written)
	sqlExec(t, r.pool, `TRUNCATE items`)

	want := r.waitApplied(6*time.Minute, "items") // generous: Connect restarts took 2 min under CI load
	t.Logf("source changes: %d", total(want))
	s := r.checkStats(total(want), items, hb)
	if s.Duplicates == 0 {
		t.Log("the restarted connector re-sent nothing (it had flushed its offsets just before the kill)")
	}
	if s.NotChanges == 0 {
		t.Error("no tombstone or heartbeat was counted as not a change")
	}
	// Keys of one COPY differ (else all but one row would have been skipped: counted above).
	var copyKeys int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(DISTINCT key) FROM applied WHERE row_id::int BETWEEN 2000 AND 2499 AND op = 'c'`).Scan(&copyKeys); err != nil || copyKeys != 500 {
		t.Errorf("500 COPY rows have %d distinct keys (%v)", copyKeys, err)
	}
	// A snapshot read and a later streamed change of one row have different keys.
	var snapKey, updKey string
	_ = r.pool.QueryRow(context.Background(), `SELECT max(key) FILTER (WHERE op = 'r'), max(key) FILTER (WHERE op = 'u') FROM applied WHERE row_id = '5'`).Scan(&snapKey, &updKey)
	if snapKey == "" || updKey == "" || snapKey == updKey {
		t.Errorf("row 5: snapshot key %q, update key %q", snapKey, updKey)
	}

	sum, fake := runDAGTrigger(t, r, items)
	checkRuns(t, fake, sum, want)
	if sum["ops_skipped"] != 1 {
		t.Errorf("dagtrigger skipped %d events by op, want 1 (the truncate)", sum["ops_skipped"])
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	var toast, del int
	for _, conf := range fake.runs {
		var c map[string]any
		_ = json.Unmarshal(conf, &c)
		if c["name"] == "toast" && c["qty"] == float64(9) {
			toast++
			if _, has := c["body"]; has {
				t.Errorf("TOAST update conf %s has a body", conf)
			}
		}
		if c["op"] == "d" {
			del++
			if b, _ := c["before"].(map[string]any); len(b) != 1 || b["id"] == nil {
				t.Errorf("delete conf %s: want only the key's columns in before", conf)
			}
		}
	}
	if toast != 1 || del == 0 {
		t.Errorf("%d TOAST update runs (want 1), %d delete runs", toast, del)
	}
}

// TestCDCKeylessAndIncrementalSnapshot: a keyless table (REPLICA IDENTITY FULL) with
// transaction metadata on, identical rows in one COPY and one INSERT; then a 20,000-row
// table added to the capture after the initial snapshot and read by an incremental snapshot
// (signal table), and partly read again by a second one while unchanged: no new effect.
func TestCDCKeylessAndIncrementalSnapshot(t *testing.T) {
	r := newRig(t)
	sqlExec(t, r.pool, `CREATE TABLE kl (a int, b text); ALTER TABLE kl REPLICA IDENTITY FULL`)
	sqlExec(t, r.pool, `CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL)`)
	sqlExec(t, r.pool, `INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 20000) g`)
	audited(t, r.pool, "kl", "ab")
	audited(t, r.pool, "big", "id")
	r.startConnector(map[string]string{"provide.transaction.metadata": "true", "value.converter.schemas.enable": "true",
		"incremental.snapshot.chunk.size": "5000"},
		"public.kl", "public.debezium_signal")
	sqlExec(t, r.pool, `INSERT INTO kl VALUES (0, 'first')`)
	kl := r.topic("kl")
	r.startConsumer(kl)

	conn, err := r.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]any
	for i := range 200 {
		rows = append(rows, []any{i % 50, "dup"}) // each row 4 times in one COPY
	}
	if _, err := conn.Conn().CopyFrom(context.Background(), pgx.Identifier{"kl"}, []string{"a", "b"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	sqlExec(t, r.pool, `INSERT INTO kl VALUES (7, 'same'), (7, 'same'), (7, 'same')`)
	sqlExec(t, r.pool, `BEGIN; UPDATE kl SET b = 'upd' WHERE a = 7; DELETE FROM kl WHERE a = 1; COMMIT`)
	r.waitApplied(2*time.Minute, "kl")

	// big joins the capture, then an incremental snapshot reads it.
	cfg := maps.Clone(r.conn.Config)
	cfg["table.include.list"] += ",public.big"
	r.conn.Update(t, cfg)
	sqlExec(t, r.pool, `INSERT INTO audit (tbl, op, row_id) SELECT 'big', 'r', id::text FROM big`)
	start := time.Now()
	sqlExec(t, r.pool, `INSERT INTO debezium_signal VALUES ('snap-1', 'execute-snapshot', '{"data-collections": ["public.big"], "type": "incremental"}')`)
	big := r.topic("big")
	cdctest.WaitEndOffset(t, r.brokers, big, 20000, 3*time.Minute)
	t.Logf("incremental snapshot of 20,000 rows on the topic after %s", time.Since(start).Round(time.Millisecond))
	r.checkStats(total(r.counts("audit", "kl")), kl)
	r.stop()
	r.startConsumer(big) // the kl records stay with the first consumer's group
	r.waitApplied(3*time.Minute, "kl", "big")
	want := r.counts("audit", "big")

	// A second incremental snapshot of the unchanged table (its first 2,000 rows): the same
	// keys, no new effect.
	sqlExec(t, r.pool, `INSERT INTO debezium_signal VALUES ('snap-2', 'execute-snapshot', '{"data-collections": ["public.big"], "type": "incremental",
		"additional-conditions": [{"data-collection": "public.big", "filter": "id <= 2000"}]}')`)
	cdctest.WaitEndOffset(t, r.brokers, big, 22000, 3*time.Minute)
	r.waitApplied(time.Minute, "kl", "big")
	s := r.checkStats(total(want), big)
	if s.Duplicates != 2000 {
		t.Errorf("%d copies absorbed, want the 2,000 rows of the second snapshot", s.Duplicates)
	}

	sum, fake := runDAGTrigger(t, r, big)
	checkRuns(t, fake, sum, r.counts("audit", "big"))
	if sum["events_repeated"] != 2000 {
		t.Errorf("dagtrigger absorbed %d re-read rows, want 2000", sum["events_repeated"])
	}
}

// TestCDCSnapshotKilledAndRestarted: Connect killed with SIGKILL half-way through an
// initial snapshot; the restarted connector snapshots again from the start, re-reading rows
// already sent at a new position. One effect per row.
func TestCDCSnapshotKilledAndRestarted(t *testing.T) {
	r := newRig(t)
	const n = 10000
	sqlExec(t, r.pool, `CREATE TABLE snap (id int PRIMARY KEY, v text NOT NULL)`)
	sqlExec(t, r.pool, fmt.Sprintf(`INSERT INTO snap SELECT g, md5(g::text) FROM generate_series(1, %d) g`, n))
	audited(t, r.pool, "snap", "id")
	sqlExec(t, r.pool, `INSERT INTO audit (tbl, op, row_id) SELECT 'snap', 'r', id::text FROM snap`)
	// Small batches slow the snapshot down enough to kill it half-way.
	r.startConnector(map[string]string{"max.batch.size": "256", "snapshot.fetch.size": "256"}, "public.snap")
	topic := r.topic("snap")
	cdctest.WaitTopic(t, r.brokers, topic, time.Minute)
	cdctest.WaitEndOffset(t, r.brokers, topic, 500, time.Minute)
	cdctest.KillWorker(t)
	got := cdctest.EndOffset(t, r.brokers, topic)
	if got >= n {
		t.Fatalf("the snapshot had finished (%d records) before the kill", got)
	}
	t.Logf("Connect killed with SIGKILL after %d of %d snapshot rows", got, n)
	start := time.Now()
	cdctest.StartWorker(t)
	r.conn.Register(t)
	t.Logf("Connect restarted and the connector running again after %s", time.Since(start).Round(time.Millisecond))
	total := cdctest.WaitEndOffset(t, r.brokers, topic, got+n, 3*time.Minute)
	t.Logf("the restarted snapshot done after %s", time.Since(start).Round(time.Millisecond))
	t.Logf("%d records on the topic: %d rows read twice", total, total-n)
	r.startConsumer(topic)
	want := r.waitApplied(2*time.Minute, "snap")
	r.checkStats(n, topic)

	// The same row read by the interrupted snapshot and by its restart: one key.
	rows, err := r.pool.Query(context.Background(), `SELECT count(DISTINCT key) FROM applied WHERE op = 'r'`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	if err != nil || keys != n {
		t.Errorf("%d distinct keys for %d rows (%v)", keys, n, err)
	}

	sum, fake := runDAGTrigger(t, r, topic)
	checkRuns(t, fake, sum, want)
	if sum["events_repeated"] != total-n {
		t.Errorf("dagtrigger absorbed %d re-read rows, want %d", sum["events_repeated"], total-n)
	}
}
