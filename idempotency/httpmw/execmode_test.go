package httpmw

import (
	"net/http"
	"testing"
	"time"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/pg"
)

// Regression (issue 48, defect 2): in pgx's exec and simple_protocol query modes — what
// pg.ParsePoolConfig picks behind PgBouncer — pgx sends arguments as untyped text, and the
// stored headers (a []byte) reached the jsonb column as bytea's hex text: every keyed
// request answered 500 "invalid input syntax for type json". Each mode stores a response
// and replays it with its allow-listed headers, with and without InFlightTimeout (the two
// lock statements) and with a finite and an infinite Retention.
func TestStoreAndReplayInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range testenv.QueryExecModeNames {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := newBundle(t, testenv.PostgresInMode(t, mode))
			for i, cfg := range []*Config{{}, {InFlightTimeout: 30 * time.Second, Retention: pg.KeepForever}} {
				b.serve(t, cfg, nil)
				key := "exec-mode/" + mode + "/" + string(rune('a'+i))
				r1 := b.post(t, key, `{"customer":1}`)
				if r1.status != http.StatusOK {
					t.Fatalf("config %d: first call answered %d, want 200: %s", i, r1.status, r1.body)
				}
				r2 := b.post(t, key, `{"customer":1}`)
				if r2.status != http.StatusOK || r2.body != r1.body || r2.header.Get(HeaderReplayed) != "true" {
					t.Fatalf("config %d: repeat answered %d %q %v, want the stored response replayed", i, r2.status, r2.body, r2.header)
				}
				if r2.header.Get("Location") != "/work/"+key || r2.header.Get("Content-Type") != "application/json" {
					t.Fatalf("config %d: allow-listed headers not replayed: %v", i, r2.header)
				}
				if r3 := b.post(t, key, `{"customer":2}`); r3.status != http.StatusUnprocessableEntity {
					t.Fatalf("config %d: the key with another body answered %d, want 422", i, r3.status)
				}
			}
			if n := b.calls.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}
