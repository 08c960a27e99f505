package httpmw

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// raiseOnStore makes every write to the stored responses fail with code (a trigger), as a
// full disk (53100) or a constraint (23514) would.
func raiseOnStore(t *testing.T, b *testBundle, code string) {
	t.Helper()
	fn := pgx.Identifier{b.schema, "raise_" + code}.Sanitize()
	if _, err := b.pool.Exec(context.Background(), `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'played' USING ERRCODE = '`+code+`'; END $$;
		CREATE TRIGGER raise BEFORE INSERT ON `+pgx.Identifier{b.schema, "idempotency_responses"}.Sanitize()+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}
}

// TestServerConditionAnswers503: the database's own condition (53100 disk_full, internal/pgerr's
// Server class) answers 503 with Retry-After, so the client waits; a statement's failure
// answers 500. Neither stores a response nor commits the handler's work.
func TestServerConditionAnswers503(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]int{"53100": http.StatusServiceUnavailable, "23514": http.StatusInternalServerError} {
		b := setup(t, nil, nil)
		raiseOnStore(t, b, code)
		r := b.post(t, "k-"+code, `{}`)
		if r.status != want || (want == 503) != (r.header.Get("Retry-After") != "") || !strings.Contains(r.body, "Idempotency-Key") {
			t.Errorf("%s: %d %v %s, want %d (Retry-After only with 503)", code, r.status, r.header, r.body, want)
		}
		if b.count(t, "work") != 0 || b.count(t, "idempotency_responses") != 0 {
			t.Errorf("%s: the handler's work or a response was committed", code)
		}
	}
}
