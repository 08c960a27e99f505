package console

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// A console given Airflow access shows a group's Airflow drift beside its offsets, per kind
// and highlighted as an attention item, and answers it at GET /api/airflow/drift; the
// comparison runs once per AirflowDriftTTL; a failed comparison is shown with every secret
// masked; a console without Airflow access shows no section and answers 404.
func TestAirflowDriftBesideTheOffsets(t *testing.T) {
	f := newSchemaFixture(t)
	f.group = testenv.Group(t)
	const secret = "airflow-pw-CANARY-0123456789"
	var calls atomic.Int32
	fail := atomic.Bool{}
	srv := f.server(func(c *Config) {
		c.Secrets = append(c.Secrets, secret)
		c.AirflowDrift = func(ctx context.Context, group string) (AirflowDrift, error) {
			calls.Add(1)
			if fail.Load() {
				return AirflowDrift{}, errors.New("airflow: POST /auth/token refused the password " + secret)
			}
			return AirflowDrift{Entries: 40, Missing: 5, Queued: 2, Failed: 1, Cleared: 3}, nil
		}
	})
	code, page := call(t, nil, http.MethodGet, srv.URL+"/offsets?group="+f.group, f.token, "", "Accept", "text/html")
	if code != http.StatusOK {
		t.Fatalf("offsets page: %d %s", code, page)
	}
	i := strings.Index(page, `id="airflow-drift"`)
	if i < 0 {
		t.Fatalf("the offsets page has no Airflow drift section:\n%s", page)
	}
	section := page[strings.LastIndex(page[:i], "<p"):]
	section = section[:strings.Index(section, "</p>")]
	for _, want := range []string{`class="summary attention"`, "5 missing", "2 queued", "1 failed", "of 40 ledger entries", "3 runs cleared", "kafkatx airflow status --group " + f.group} {
		if !strings.Contains(section, want) {
			t.Errorf("the Airflow drift section lacks %q:\n%s", want, section)
		}
	}
	code, body := call(t, nil, http.MethodGet, srv.URL+"/api/airflow/drift?group="+f.group, f.token, "")
	if code != http.StatusOK || !strings.Contains(body, `"missing":5`) || !strings.Contains(body, `"queued":2`) || !strings.Contains(body, `"failed":1`) {
		t.Errorf("GET /api/airflow/drift: %d %s", code, body)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the comparison ran %d times for two views within AirflowDriftTTL, want once", n)
	}
	// A failed comparison (another group: not cached) is shown, the secret masked.
	fail.Store(true)
	other := f.group + "-other"
	_, page = call(t, nil, http.MethodGet, srv.URL+"/offsets?group="+other, f.token, "", "Accept", "text/html")
	_, body = call(t, nil, http.MethodGet, srv.URL+"/api/airflow/drift?group="+other, f.token, "")
	if !strings.Contains(page, "not compared: airflow: POST /auth/token refused") || !strings.Contains(body, `"error"`) {
		t.Errorf("a failed comparison is not shown:\n%s\n%s", page, body)
	}
	if strings.Contains(page+body+f.logs.String(), secret) {
		t.Errorf("the secret shows in an answer or the logs")
	}
	// No Airflow access: no section, 404.
	plain := f.server(nil)
	_, page = call(t, nil, http.MethodGet, plain.URL+"/offsets?group="+f.group, f.token, "", "Accept", "text/html")
	if strings.Contains(page, `id="airflow-drift"`) {
		t.Error("a console without Airflow access shows an Airflow section")
	}
	if code, _ := call(t, nil, http.MethodGet, plain.URL+"/api/airflow/drift?group="+f.group, f.token, ""); code != http.StatusNotFound {
		t.Errorf("GET /api/airflow/drift without Airflow access: %d, want 404", code)
	}
}
