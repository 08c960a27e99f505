package airflow

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkOtherRowsBesideOneRefusedRow measures what one row refused by Airflow costs the
// other rows through the Client's default (adaptive) limit: 8 callers — a consumer's 8 lanes
// (--concurrency 8) — trigger runs against a stand-in answering every request after 80 ms (a
// create: 200, or 409 for a run it holds; a read of a run: 404; the DAG: not paused), about 98
// runs/s for 8 callers.
// With refused=one, the first caller's run is answered 503 every time, as dagtrigger's client
// tries it (3 tries, backoff 200 ms to 1 s), and tried again 200 ms after each failure (a
// consumer's first waits before its next try); the 7 others trigger new runs, one after the
// other. It reports the 7 others' runs a second (other-runs/s; with refused=none, 7/8 of all
// runs) over 15 s, whatever b.N (run with -benchtime=1x), and the limit at the end. Only the
// package's API as of before the per-key rule is used (the refused run's requests carry its
// Trigger.Key), so the same file measures the code before it.
func BenchmarkOtherRowsBesideOneRefusedRow(b *testing.B) {
	for _, refused := range []string{"none", "one"} {
		b.Run("refused="+refused, func(b *testing.B) {
			var runs, refusals atomic.Int64
			var mu sync.Mutex
			held := map[string]bool{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Reads too: a read answered at once would be the limit's latency without load.
				time.Sleep(80 * time.Millisecond)
				if r.Method == http.MethodGet && r.URL.Path == "/api/v2/dags/d" {
					// The DAG's state, which the client reads before its creates: not paused.
					_, _ = io.WriteString(w, `{"dag_id":"d","is_paused":false}`)
					return
				}
				if r.Method == http.MethodGet {
					http.Error(w, `{"detail":"not found"}`, http.StatusNotFound)
					return
				}
				var body struct {
					DAGRunID string `json:"dag_run_id"`
				}
				raw, _ := io.ReadAll(r.Body)
				_ = json.Unmarshal(raw, &body)
				if strings.HasPrefix(body.DAGRunID, "refused") {
					refusals.Add(1)
					http.Error(w, `{"detail":"Service Unavailable"}`, http.StatusServiceUnavailable)
					return
				}
				mu.Lock()
				dup := held[body.DAGRunID]
				held[body.DAGRunID] = true
				mu.Unlock()
				if dup {
					http.Error(w, `{"detail":"exists"}`, http.StatusConflict)
					return
				}
				runs.Add(1)
				_, _ = io.WriteString(w, `{"state":"queued"}`)
			}))
			defer srv.Close()
			c, err := New(Config{BaseURL: srv.URL, MaxAttempts: 3, MaxBackoff: time.Second,
				HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for lane := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ctx.Err() == nil; i++ {
						if lane == 0 && refused == "one" {
							if _, err := c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: "row-7", RunID: "refused-row-7"}); err != nil {
								select {
								case <-ctx.Done():
								case <-time.After(200 * time.Millisecond):
								}
							}
							continue
						}
						_, _ = c.TriggerDAGRun(ctx, Trigger{DAGID: "d", Key: fmt.Sprintf("lane-%d-%d", lane, i), RunID: fmt.Sprintf("ok-%d-%d", lane, i)})
					}
				}()
			}
			start := time.Now()
			wg.Wait()
			el := time.Since(start).Seconds()
			others := float64(runs.Load())
			if refused == "none" {
				others = others * 7 / 8 // the same 7 lanes' share, for comparison
			}
			b.ReportMetric(others/el, "other-runs/s")
			b.ReportMetric(float64(refusals.Load()), "503s")
			b.ReportMetric(float64(c.cfg.Limiter.Limit()), "limit")
		})
	}
}
