package kafkatx

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// installDiskFull makes every insert into the test's effects table fail with SQLSTATE 53100
// (disk_full), as a full disk would; the returned function removes it.
func installDiskFull(t *testing.T, b *testBundle) func() {
	t.Helper()
	b.exec(t, `CREATE FUNCTION {{schema}}.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100'; END $$;
		CREATE TRIGGER disk_full BEFORE INSERT ON {{schema}}.effects FOR EACH ROW EXECUTE FUNCTION {{schema}}.disk_full()`)
	return func() { b.exec(t, `DROP TRIGGER disk_full ON {{schema}}.effects`) }
}

// TestServerConditionIsWaitedOutWithoutAttempts: while the database answers 53100 disk_full
// to every write, no attempt is spent and nothing is dead-lettered even with MaxAttempts 1,
// the consumer is not ready and says why (the SQLSTATE and name, as JSON), and when the
// condition ends every healthy message is applied once and only the poison pill is
// dead-lettered.
func TestServerConditionIsWaitedOutWithoutAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	recs := append(values(30, 0, func(i int) string { return fmt.Sprintf(`{"p0":%d}`, i) }),
		values(30, 1, func(i int) string { return fmt.Sprintf(`{"p1":%d}`, i) })...)
	recs[40].value = []byte("poison")
	produce(t, b.brokers, b.topic, recs)
	end := installDiskFull(t, b)
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 1
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "poison" {
			return fmt.Errorf("poison pill")
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	waitFor(t, 60*time.Second, "both partitions waiting out 53100", func() bool {
		return len(r.c.Readiness(context.Background()).Waiting) == 2
	})
	time.Sleep(2 * time.Second) // several tries each
	rd := r.c.Readiness(context.Background())
	body, _ := json.Marshal(rd)
	if rd.Ready || !strings.Contains(strings.Join(rd.Reasons, " "), "53100 disk_full") || !strings.Contains(string(body), `"condition":"53100 disk_full"`) {
		t.Fatalf("readiness during the spell: %s; want not ready, naming 53100 disk_full", body)
	}
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.attempts") + b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"); n != 0 {
		t.Fatalf("%d attempt rows or dead letters during the spell; want none", n)
	}
	end()
	waitFor(t, 60*time.Second, "the backlog applied", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 59 && b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") == 1
	})
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 {
		t.Fatalf("%d effects applied more than once", n)
	}
	waitFor(t, 30*time.Second, "ready again", func() bool { return r.c.Readiness(context.Background()).Ready })
}

// TestServerConditionPastItsBoundCountsAttempts: the wait is bounded as Unavailable's is
// (Config.UnavailableMaxWait): past it, the condition's tries count as attempts again and
// the message is dead-lettered at MaxAttempts.
func TestServerConditionPastItsBoundCountsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, values(1, 0, func(int) string { return `{"a":1}` }))
	installDiskFull(t, b)
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	cfg.UnavailableMaxWait = time.Second
	b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	start := time.Now()
	waitFor(t, 60*time.Second, "the message dead-lettered after the bound", func() bool {
		return b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters WHERE attempts = 2 AND error_message LIKE '%No space left%'") == 1
	})
	if d := time.Since(start); d < time.Second {
		t.Fatalf("dead-lettered after %s, before the 1 s bound", d)
	}
}
