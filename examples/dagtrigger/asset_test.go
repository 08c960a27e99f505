package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeAssets implements the asset part of Airflow 3's REST API v2 that dagtrigger --asset
// uses: GET /api/v2/assets?name_pattern= (substring match), POST /api/v2/assets/events (no
// idempotency of its own: each POST is a new event, as in Airflow) and GET
// /api/v2/assets/events?asset_id=&timestamp_gte=&limit=&offset= (paged). onCreate runs after
// an event is stored and before the answer is sent.
type fakeAssets struct {
	mu       sync.Mutex
	events   []map[string]any // each with id, asset_id, extra, timestamp
	posts    int
	reads    int
	onCreate func(n int)
}

func (f *fakeAssets) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v2/assets":
		fmt.Fprint(w, `{"assets":[{"id":7,"name":"kafkatx_customers_old"},{"id":9,"name":"kafkatx_customers"}],"total_entries":2}`)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v2/assets/events":
		var body struct {
			AssetID int64          `json:"asset_id"`
			Extra   map[string]any `json:"extra"`
		}
		raw, _ := io.ReadAll(r.Body)
		if json.Unmarshal(raw, &body) != nil || body.AssetID != 9 {
			http.Error(w, `{"detail":"bad"}`, http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.posts++
		ev := map[string]any{"id": len(f.events) + 1, "asset_id": body.AssetID, "name": "kafkatx_customers", "extra": body.Extra,
			"timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
		f.events = append(f.events, ev)
		n, hook := len(f.events), f.onCreate
		f.mu.Unlock()
		if hook != nil {
			hook(n)
		}
		_ = json.NewEncoder(w).Encode(ev)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v2/assets/events":
		q := r.URL.Query()
		since, err := time.Parse(time.RFC3339Nano, q.Get("timestamp_gte"))
		limit, _ := strconv.Atoi(q.Get("limit"))
		offset, _ := strconv.Atoi(q.Get("offset"))
		if err != nil || q.Get("asset_id") != "9" || limit < 1 || limit > 100 || q.Get("order_by") != "timestamp" {
			http.Error(w, `{"detail":"bad query"}`, http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.reads++
		var match []map[string]any
		for _, ev := range f.events {
			ts, _ := time.Parse(time.RFC3339Nano, ev["timestamp"].(string))
			if !ts.Before(since) {
				match = append(match, ev)
			}
		}
		f.mu.Unlock()
		page := match[min(offset, len(match)):min(offset+limit, len(match))]
		_ = json.NewEncoder(w).Encode(map[string]any{"asset_events": page, "total_entries": len(match)})
	default:
		http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
	}
}

// TestAssetModeOneEventPerEventAcrossKills: dagtrigger --asset is SIGKILLed right after the
// stand-in stored an asset event and before it answered, twice; the restarted process finds
// the pending mark, reads the asset's events back and posts nothing again. Each Kafka event
// yields exactly one asset event whose extra carries its kafkatx_id and row, and one ledger
// row.
func TestAssetModeOneEventPerEventAcrossKills(t *testing.T) {
	t.Parallel()
	f := &fakeAssets{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	e := newEnv(t, srv.URL)
	const n = 20
	produce(t, e.brokers, e.topic, 1, n)
	asset := []string{"--asset", "kafkatx_customers"}
	var mu sync.Mutex
	var victim *exec.Cmd
	killAt := map[int]bool{3: true, 11: true}
	f.mu.Lock()
	f.onCreate = func(created int) {
		mu.Lock()
		defer mu.Unlock()
		if killAt[created] && victim != nil {
			_ = victim.Process.Signal(syscall.SIGKILL)
			delete(killAt, created)
		}
	}
	f.mu.Unlock()
	for run := 0; run < 2; run++ {
		cmd := e.command(asset...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		victim = cmd
		mu.Unlock()
		err := cmd.Wait()
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("run %d ended with %v, want the SIGKILL sent between the POST and its answer", run, err)
		}
	}
	mu.Lock()
	victim = nil
	mu.Unlock()
	sum := e.finish(t, 2, asset...)
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := map[string]int{}
	rowsSeen := map[float64]bool{}
	for _, ev := range f.events {
		extra := ev["extra"].(map[string]any)
		id, _ := extra["kafkatx_id"].(string)
		ids[id]++
		if row, ok := extra["row"].(map[string]any); ok {
			rowsSeen[row["id"].(float64)] = true
		}
	}
	if len(f.events) != n || len(ids) != n || len(rowsSeen) != n {
		t.Errorf("%d asset events, %d distinct kafkatx_id, %d distinct rows for %d events (posts %d)", len(f.events), len(ids), len(rowsSeen), n, f.posts)
	}
	for id, c := range ids {
		if c != 1 || id == "" {
			t.Errorf("kafkatx_id %q carried by %d events", id, c)
		}
	}
	if f.reads < 2 {
		t.Errorf("%d read-backs after 2 kills between POST and answer; want at least one per kill", f.reads)
	}
	rows := ledger(t, e)
	for id, outcomes := range rows {
		if len(outcomes) != 1 || ids[id] != 1 {
			t.Errorf("ledger holds kafkatx_id %s as %v; Airflow has it %d times", id, outcomes, ids[id])
		}
	}
	if len(rows) != n || sum["dead_lettered"] != 0 {
		t.Errorf("ledger %d rows for %d events; summary %v", len(rows), n, sum)
	}
}
