package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Mounted under a path prefix (http.StripPrefix and Config.BasePath), the console's links,
// script, redirects and session cookie stay under it.
func TestMountedUnderAPathPrefix(t *testing.T) {
	t.Parallel()
	f := newSchemaFixture(t)
	h, err := New(Config{Pool: f.pool, Schema: f.schema, Kafka: kafka.ConfigMap{"bootstrap.servers": f.brokers}, TokenFile: f.tokFile, BasePath: "/ops/"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", h))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the service's own page", http.StatusTeapot)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if code, body := call(t, nil, "GET", srv.URL+"/ops/api/partitions", f.token, ""); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Fatalf("GET /ops/api/partitions: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/ops/", nil)
	resp, err := noRedirect().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ops/signin" {
		t.Fatalf("GET /ops/ without a session: %d to %q, want 303 to /ops/signin", resp.StatusCode, loc)
	}
	resp, err = noRedirect().PostForm(srv.URL+"/ops/signin", url.Values{"token": {f.token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "/ops/" || len(resp.Cookies()) != 1 || resp.Cookies()[0].Path != "/ops/" {
		t.Fatalf("sign-in under /ops: to %q, cookies %v", loc, resp.Cookies())
	}
	c, _ := signIn(t, &httptest.Server{URL: srv.URL + "/ops"}, f.token)
	page := call2(t, c, srv.URL+"/ops/")
	if !strings.Contains(page, `src="/ops/static/console.js"`) || !strings.Contains(page, `action="/ops/signout"`) || !strings.Contains(page, `href="/ops/dead-letters"`) {
		t.Fatalf("the page's links leave /ops: %.1500s", page)
	}
	if code, js := call(t, nil, "GET", srv.URL+"/ops/static/console.js", "", ""); code != 200 || !strings.Contains(js, "/api/partitions") {
		t.Fatalf("GET /ops/static/console.js: %d", code)
	}
}
