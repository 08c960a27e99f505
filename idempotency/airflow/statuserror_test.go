package airflow

import "testing"

// A StatusError names the request's method once: POST when its Endpoint is a bare path, the
// Endpoint's own otherwise (a new user saw "to POST PATCH /api/v2/dags/…").
func TestStatusErrorNamesItsMethodOnce(t *testing.T) {
	for endpoint, want := range map[string]string{
		"/api/v2/dags/d/dagRuns":                      "airflow answered 503 Service Unavailable to POST /api/v2/dags/d/dagRuns: no",
		"GET /api/v2/assets":                          "airflow answered 503 Service Unavailable to GET /api/v2/assets: no",
		"PATCH /api/v2/dags/d/dagRuns/r":              "airflow answered 503 Service Unavailable to PATCH /api/v2/dags/d/dagRuns/r: no",
		"DELETE /api/v2/dags/d/assets/5/queuedEvents": "airflow answered 503 Service Unavailable to DELETE /api/v2/dags/d/assets/5/queuedEvents: no",
	} {
		if got := (&StatusError{StatusCode: 503, Endpoint: endpoint, Detail: "no"}).Error(); got != want {
			t.Errorf("%q: %q, want %q", endpoint, got, want)
		}
	}
}
