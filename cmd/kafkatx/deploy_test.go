package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// isLeader reports whether the relay serving /readyz on addr says it leads (false when it
// does not answer).
func isLeader(addr string) bool {
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), `"leader":true`)
}

// Two `kafkatx relay` sidecars over SASL_SSL with their rows read and marked through PgBouncer
// in transaction mode and the leadership lock on --session-database-url: the leader is
// SIGKILLed mid-stream and the standby takes over within seconds; at no sample do both lead;
// every row is published (at least once, each copy with its outbox id). Without a session URL
// the relay refuses to start (exit 1, naming the transaction pooler).
func TestRelayFailoverBehindPgBouncer(t *testing.T) {
	t.Parallel()
	sb, props, cfgFile := testenv.SecureKafka(t)
	password := fmt.Sprint(props["sasl.password"])
	plain := testenv.Brokers(t)
	direct := testenv.Database(t)
	pooled := testenv.ThroughPgBouncer(t, direct)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const schema = "kafkatx"
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	topic := testenv.Topic(t, plain, 3)
	cli := buildCLI(t)

	refused := exec.Command(cli, "relay", "--brokers", sb, "--kafka-config-file", cfgFile, "--database-url", pooled, "--exit-when-idle", "2s")
	out, err := refused.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 || !strings.Contains(string(out), "transaction pooler") {
		t.Fatalf("relay through PgBouncer without --session-database-url: %v, want a non-zero exit naming the transaction pooler:\n%s", err, out)
	}

	type relayProc struct {
		cmd    *exec.Cmd
		addr   string
		stderr *bytes.Buffer
	}
	start := func() *relayProc {
		r := &relayProc{addr: testenv.FreeAddr(t), stderr: &bytes.Buffer{}}
		r.cmd = exec.Command(cli, "relay", "--brokers", sb, "--kafka-config-file", cfgFile, "--database-url", pooled,
			"--session-database-url", direct, "--health-addr", r.addr, "--standby-interval", "500ms", "--batch-size", "100")
		r.cmd.Stderr = r.stderr
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.cmd.Process.Kill(); _ = r.cmd.Wait() })
		return r
	}
	relays := []*relayProc{start(), start()}
	waitLeader := func(timeout time.Duration) int {
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			for i, r := range relays {
				if r != nil && isLeader(r.addr) {
					return i
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no relay leads")
		return -1
	}
	leader := waitLeader(30 * time.Second)

	// Sample both relays' leadership until the end: never both at once.
	var both atomic.Int32
	stopWatch := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond):
			}
			n := 0
			for _, r := range relays {
				if isLeader(r.addr) {
					n++
				}
			}
			if n > 1 {
				both.Add(1)
			}
		}
	}()

	const rows = 900
	ins := `INSERT INTO ` + pgx.Identifier{schema, "outbox"}.Sanitize() + ` (topic, key, value) VALUES ($1, convert_to($2, 'UTF8'), convert_to($3, 'UTF8'))`
	var killedAt time.Time
	other := 1 - leader
	tookOver := make(chan time.Duration, 1)
	for i := 0; i < rows; i++ {
		if _, err := pool.Exec(ctx, ins, topic, "k"+strconv.Itoa(i%50), "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if i == rows/3 {
			if err := relays[leader].cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killedAt = time.Now()
			go func() {
				for time.Since(killedAt) < 30*time.Second {
					if isLeader(relays[other].addr) {
						tookOver <- time.Since(killedAt)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				close(tookOver)
			}()
		}
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	takeover, ok := <-tookOver
	if !ok {
		_ = relays[other].cmd.Process.Kill()
		_ = relays[other].cmd.Wait()
		t.Fatalf("the standby did not take over within 30 s of the leader's SIGKILL; its stderr:\n%s", relays[other].stderr.String())
	}
	var pending int64
	deadline := time.Now().Add(120 * time.Second)
	for {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM kafkatx.outbox WHERE state IN ('pending', 'parked')`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = relays[other].cmd.Process.Kill()
			_ = relays[other].cmd.Wait()
			t.Fatalf("%d rows still pending 120 s after the takeover; the new leader's stderr:\n%s", pending, tailString(relays[other].stderr.String(), 8000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stopWatch)
	wg.Wait()
	if n := both.Load(); n > 0 {
		t.Fatalf("both relays reported leading at %d samples", n)
	}

	// Every row is in the topic: read it all back (over PLAINTEXT) by outbox id.
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": plain, "group.id": testenv.Group(t), "auto.offset.reset": "earliest", "enable.auto.commit": false})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	copies := 0
	deadline = time.Now().Add(60 * time.Second)
	for len(ids) < rows && time.Now().Before(deadline) {
		m, err := c.ReadMessage(time.Second)
		if err != nil {
			continue
		}
		for _, h := range m.Headers {
			if h.Key == "kafkatx-outbox-id" {
				ids[string(h.Value)]++
				copies++
			}
		}
	}
	if len(ids) != rows {
		t.Fatalf("%d distinct outbox rows in the topic, want %d (a row lost)", len(ids), rows)
	}
	for _, r := range relays {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		if strings.Contains(r.stderr.String(), password) {
			t.Fatal("the SASL password appears in a relay's logs")
		}
	}
	t.Logf("standby led %s after the SIGKILL; %d rows, %d records (%d re-published after the kill)", takeover.Round(time.Millisecond), rows, copies, copies-rows)
}
