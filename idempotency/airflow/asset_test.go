package airflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
)

// assetAirflow stands in for Airflow's asset endpoints: assets by name_pattern (substring),
// POST /api/v2/assets/events (every POST a new event: Airflow has no key for them) and the
// paged list. failPost makes the next POSTs store the event and then answer 503 (a lost
// answer); failRead makes the list answer 500.
type assetAirflow struct {
	mu        sync.Mutex
	known     bool // whether the asset exists
	events    []map[string]any
	posts     int
	assetGets int
	failPost  int
	failRead  bool
}

func (a *assetAirflow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/api/v2/assets":
		a.assetGets++
		list := `[{"id":3,"name":"customers_v0"}]`
		if a.known {
			list = `[{"id":3,"name":"customers_v0"},{"id":4,"name":"customers"}]`
		}
		_, _ = w.Write([]byte(`{"assets":` + list + `}`))
	case r.URL.Path == "/api/v2/assets/events" && r.Method == http.MethodPost:
		var body struct {
			AssetID int64          `json:"asset_id"`
			Extra   map[string]any `json:"extra"`
		}
		if json.NewDecoder(r.Body).Decode(&body) != nil || body.AssetID != 4 || !a.known {
			http.Error(w, `{"detail":"Asset with ID not found"}`, http.StatusNotFound)
			return
		}
		a.posts++
		ev := map[string]any{"id": len(a.events) + 100, "asset_id": 4, "extra": body.Extra, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
		a.events = append(a.events, ev)
		if a.failPost > 0 {
			a.failPost--
			http.Error(w, "upstream died", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(ev)
	case r.URL.Path == "/api/v2/assets/events":
		if a.failRead || r.URL.Query().Get("asset_id") != "4" || r.URL.Query().Get("timestamp_gte") == "" || r.URL.Query().Get("order_by") != "timestamp" {
			http.Error(w, "read failed", http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"asset_events": a.events})
	default:
		http.NotFound(w, r)
	}
}

func newAssetClient(t *testing.T, a *assetAirflow) *airflow.Client {
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	c, err := airflow.New(airflow.Config{BaseURL: srv.URL, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// An asset not known yet makes the call Unavailable (the partition waits; nothing
// dead-letters) without caching the absence; once it exists, its id (the exact name among
// the substring matches) is resolved once and cached.
func TestAssetEventMissingAssetWaitsThenResolvesOnce(t *testing.T) {
	a := &assetAirflow{}
	c := newAssetClient(t, a)
	ctx := context.Background()
	_, err := c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "customers", KafkatxID: "k1"})
	if !airflow.IsUnavailable(err) || !strings.Contains(err.Error(), `no asset named "customers"`) {
		t.Fatalf("missing asset: %v, want an UnavailableError naming it", err)
	}
	a.mu.Lock()
	a.known = true
	a.assetGets = 0
	a.mu.Unlock()
	for _, k := range []string{"k1", "k2"} {
		res, err := c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "customers", KafkatxID: k, Extra: map[string]any{"row": map[string]int{"id": 1}, "kafkatx_id": "overridden"}})
		if err != nil || !res.Created || res.AssetID != 4 || res.EventID == 0 {
			t.Fatalf("create %s: %+v %v", k, res, err)
		}
	}
	if a.assetGets != 1 || a.posts != 2 {
		t.Errorf("%d asset lookups and %d posts for 2 events; want 1 lookup (cached) and 2 posts", a.assetGets, a.posts)
	}
	if x := a.events[1]["extra"].(map[string]any); x["kafkatx_id"] != "k2" || x["row"] == nil {
		t.Errorf("extra %v, want kafkatx_id k2 and the row", x)
	}
}

// A POST whose answer is lost (Airflow stored the event and answered 503) is settled by
// reading the asset's events back: one event, no second POST. A try that may have posted
// before (MaybeSentSince) and finds its event posts nothing. When the read-back itself fails,
// the client does not post again blindly.
func TestAssetEventSettledByReadingBack(t *testing.T) {
	a := &assetAirflow{known: true, failPost: 1}
	c := newAssetClient(t, a)
	ctx := context.Background()
	res, err := c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "customers", KafkatxID: "lost"})
	if err != nil || !res.Created || !res.Settled || a.posts != 1 || len(a.events) != 1 {
		t.Fatalf("lost answer: %+v %v, %d posts %d events; want settled with one post", res, err, a.posts, len(a.events))
	}
	res, err = c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "customers", KafkatxID: "lost", MaybeSentSince: time.Now().Add(-time.Second)})
	if err != nil || res.Created || a.posts != 1 {
		t.Fatalf("a retry after a crash: %+v %v, %d posts; want found (Created false) and no post", res, err, a.posts)
	}
	a.mu.Lock()
	a.failPost, a.failRead = 1, true
	a.mu.Unlock()
	_, err = c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: "customers", KafkatxID: "unknown"})
	if err == nil || a.posts != 2 {
		t.Fatalf("a lost answer whose read-back fails: %v after %d posts; want an error after the one post", err, a.posts)
	}
	var se *airflow.StatusError
	if !errors.As(err, &se) || !airflow.IsUnavailable(err) {
		t.Errorf("error %v: want an UnavailableError carrying the StatusError (the partition waits; nothing dead-letters)", err)
	}
}
