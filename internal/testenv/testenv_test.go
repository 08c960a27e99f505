package testenv

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestUniqueName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9_-]+$`)
	seen := map[string]bool{}
	for range 100 {
		n := UniqueName(t, "t_", 63)
		if len(n) > 63 || !valid.MatchString(n) || !strings.HasPrefix(n, "t_testuniquename_") || seen[n] {
			t.Fatalf("bad or repeated name %q", n)
		}
		seen[n] = true
	}
	t.Run("a very long subtest name, with Spaces/and Punctuation! that goes on and on and on", func(t *testing.T) {
		if n := UniqueName(t, "t_", 63); len(n) > 63 || !valid.MatchString(n) {
			t.Fatalf("bad name %q", n)
		}
		if n := UniqueName(t, "kafkatx-test-", 200); !valid.MatchString(n) || strings.Contains(n, "_") {
			t.Fatalf("bad topic name %q", n)
		}
	})
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@127.0.0.1:5432/kafkatx?sslmode=disable", "postgres://u:p@127.0.0.1:5432/t_x?sslmode=disable"},
		{"postgresql://u@h/db", "postgresql://u@h/t_x"},
		{"postgres://u@h", "postgres://u@h/t_x"},
		{"host=h user=u dbname=kafkatx", "host=h user=u dbname=kafkatx dbname=t_x"},
	} {
		got, err := withDatabase(tc.in, "t_x")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestDatabase(t *testing.T) {
	t.Parallel()
	dsn := Database(t)
	pool := connect(t, dsn)
	var name string
	if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(name, "t_testdatabase_") {
		t.Fatalf("connected to %q, want the fresh database", name)
	}
	// A connection left open does not stop the drop at cleanup (WITH (FORCE)).
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+pgx.Identifier{"x"}.Sanitize()+" (id int)"); err != nil {
		t.Fatal(err)
	}
}

func TestSchemaIsDropped(t *testing.T) {
	t.Parallel()
	pool := Postgres(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		name = Schema(t, pool)
		if _, err := pool.Exec(context.Background(), "CREATE TABLE "+pgx.Identifier{name, "t"}.Sanitize()+" (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("schema %s still exists after its test ended", name)
	}
}
