package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// TestApplyIsSafeFromManyProcessesAndRerunnable applies the migrations from eight
// connections at once to a fresh schema, then once more: each version is applied exactly
// once, and the second run applies nothing.
func TestApplyIsSafeFromManyProcessesAndRerunnable(t *testing.T) {
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	applied := make(chan []int, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vs, err := migrations.Apply(ctx, pool, schema)
			errs <- err
			applied <- vs
		}()
	}
	wg.Wait()
	close(errs)
	close(applied)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for vs := range applied {
		total += len(vs)
	}
	if want := len(migrations.All()); total != want {
		t.Fatalf("%d versions applied in all by 8 concurrent runs, want %d (each once)", total, want)
	}
	var n int
	if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{schema, "schema_migrations"}.Sanitize())).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(migrations.All()) {
		t.Fatalf("schema_migrations holds %d rows, want %d", n, len(migrations.All()))
	}
	again, err := migrations.Apply(ctx, pool, schema)
	if err != nil || len(again) != 0 {
		t.Fatalf("a second Apply applied %v (err %v), want nothing", again, err)
	}
}

func TestScriptNamesTheSchemaQuoted(t *testing.T) {
	sql := migrations.Script(`we"ird`)
	if !strings.Contains(sql, `CREATE SCHEMA IF NOT EXISTS "we""ird"`) || strings.Contains(sql, "{{schema}}") {
		t.Fatalf("script does not quote the schema or leaves a placeholder:\n%.300s", sql)
	}
}
