package main

import (
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRealAirflowAssetEventsOncePerEventAcrossKills: dagtrigger --asset kafkatx_customers
// against the real Airflow 3.3.2, through a proxy that SIGKILLs it right after Airflow
// created the 3rd and the 9th asset event and before the answer reaches it (its transaction
// never commits; the restarted process finds the pending mark and reads Airflow's events
// back instead of posting again). Every Kafka event yields exactly one asset event on
// kafkatx_customers (each kafkatx_id once) and one ledger row.
func TestRealAirflowAssetEventsOncePerEventAcrossKills(t *testing.T) {
	t.Parallel()
	af := needAirflow(t)
	var asset struct {
		Assets []struct {
			ID   int64  `json:"id"`
			Name string `json:"name"`
		} `json:"assets"`
	}
	if _, err := af.do(http.MethodGet, "/api/v2/assets?name_pattern=kafkatx_customers&limit=100", nil, &asset); err != nil {
		t.Fatal(err)
	}
	var assetID int64
	for _, a := range asset.Assets {
		if a.Name == "kafkatx_customers" {
			assetID = a.ID
		}
	}
	if assetID == 0 {
		t.Fatal("Airflow has no asset kafkatx_customers (examples/dags' process_customer_asset not parsed)")
	}
	e := newEnv(t, af.url)
	const n = 14
	since := time.Now().UTC().Add(-time.Minute)

	var mu sync.Mutex
	var victim *exec.Cmd
	created := 0
	killAt := map[int]bool{3: true, 9: true}
	target, _ := url.Parse(af.url)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || resp.Request.URL.Path != "/api/v2/assets/events" || resp.StatusCode != http.StatusOK {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		created++
		if killAt[created] && victim != nil {
			_ = victim.Process.Signal(syscall.SIGKILL) // before the answer is relayed
			delete(killAt, created)
		}
		return nil
	}
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	srv := &http.Server{Handler: proxy}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	e.airflowURL = "http://" + ln.Addr().String()
	// Events of this run only: their source positions (and so their kafkatx_ids) are new.
	base := rand.Int64N(1 << 40)
	var kvs [][2][]byte
	for i := 1; i <= n; i++ {
		kvs = append(kvs, [2][]byte{fmt.Appendf(nil, `{"id":%d}`, i), fmt.Appendf(nil,
			`{"before":null,"after":{"id":%d,"status":"active"},"source":{"connector":"postgresql","db":"app","schema":"public","table":"customers","lsn":%d,"txId":%d},"op":"c","ts_ms":1790000000000}`,
			i, base*64+int64(i)*64, base+int64(i))})
	}
	produceRaw(t, e.brokers, e.topic, kvs)
	args := []string{"--asset", "kafkatx_customers", "--airflow-username", af.username, "--airflow-password-file", af.passwordFile, "--concurrency", "1"}
	for run := 0; run < 2; run++ {
		cmd, _ := e.start(t, run, args...)
		mu.Lock()
		victim = cmd
		mu.Unlock()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			t.Fatalf("dagtrigger run %d was not killed after a created asset event within 3 minutes", run)
		}
		mu.Lock()
		victim = nil
		mu.Unlock()
		if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("dagtrigger run %d ended with %v, want the SIGKILL between Airflow's create and the commit", run, cmd.ProcessState)
		}
	}
	sum := e.finish(t, 9, args...)
	if sum["dead_lettered"] != 0 {
		t.Fatalf("dagtrigger dead-lettered events: %v", sum)
	}
	rows := ledger(t, e)
	var events struct {
		Events []struct {
			ID    int64          `json:"id"`
			Extra map[string]any `json:"extra"`
		} `json:"asset_events"`
	}
	counts := map[string]int{}
	for offset := 0; ; offset += 100 {
		events.Events = nil
		path := fmt.Sprintf("/api/v2/assets/events?asset_id=%d&timestamp_gte=%s&order_by=timestamp&limit=100&offset=%d", assetID, since.Format("2006-01-02T15:04:05.000000Z"), offset)
		if _, err := af.do(http.MethodGet, path, nil, &events); err != nil {
			t.Fatal(err)
		}
		for _, ev := range events.Events {
			if id, _ := ev.Extra["kafkatx_id"].(string); rows[id] != nil {
				counts[id]++
			}
		}
		if len(events.Events) < 100 {
			break
		}
	}
	if len(rows) != n || len(counts) != n {
		t.Errorf("%d ledger rows and %d of their kafkatx_ids in Airflow, want %d each", len(rows), len(counts), n)
	}
	for id, c := range counts {
		if c != 1 || len(rows[id]) != 1 {
			t.Errorf("kafkatx_id %s: %d asset events in Airflow, ledger %v; want one each", id, c, rows[id])
		}
	}
	t.Logf("2 SIGKILLs after a create; %d creates seen by the proxy; summary %v", created, sum)
}
