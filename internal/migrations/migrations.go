// Package migrations holds kafkatx's embedded, versioned SQL and applies it.
//
// Each file in sql/ is one version, named NNN_name.sql, and may use the placeholder
// {{schema}} (replaced with the quoted schema identifier) and {{schema_name}} (replaced
// with the schema name as a SQL string literal's content). Apply runs the versions not yet
// recorded in {{schema}}.schema_migrations, each in its own transaction, under a
// session-level advisory lock, so several processes starting at once apply each version
// exactly once.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/pg"

	"github.com/kafkatx/kafkatx/internal/tables"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one embedded schema version.
type Migration struct {
	Version int
	Name    string
	sql     string
}

// SQL returns the migration's statements for the given schema.
func (m Migration) SQL(schema string) string { return render(m.sql, schema) }

// All returns every embedded migration in version order.
func All() []Migration {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err) // embedded at build time; cannot fail at run time
	}
	var out []Migration
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".sql")
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("migrations: bad file name %q", e.Name()))
		}
		b, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: rest, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Latest is the highest embedded version.
func Latest() int {
	all := All()
	return all[len(all)-1].Version
}

func render(sql, schema string) string {
	r := strings.NewReplacer(
		"{{schema}}", tables.For(schema).QuotedSchema,
		"{{schema_name}}", strings.ReplaceAll(schema, "'", "''"),
	)
	return r.Replace(sql)
}

// Script returns every migration for schema as one SQL script, with the bookkeeping
// statements, for teams that apply migrations with their own tool (goose, atlas, tern).
func Script(schema string) string {
	var b strings.Builder
	t := tables.For(schema)
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", t.QuotedSchema)
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());\n", t.Migrations)
	for _, m := range All() {
		fmt.Fprintf(&b, "\n-- version %d: %s\n%s\n", m.Version, m.Name, m.SQL(schema))
		fmt.Fprintf(&b, "INSERT INTO %s (version, name) VALUES (%d, '%s') ON CONFLICT DO NOTHING;\n", t.Migrations, m.Version, m.Name)
	}
	return b.String()
}

// lockKey is the advisory lock that serializes migrations of one schema across processes.
func lockKey(schema string) string { return "kafkatx.migrate." + schema }

// Apply brings schema up to the latest embedded version and returns the versions it applied.
// It is safe to call from several processes at once and to call again.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: acquire connection: %w", err)
	}
	defer conn.Release()
	// The lock is session-level: refuse a transaction pooler, where it would stay on whichever
	// server connection took it.
	if err := pg.RequireSession(ctx, conn.Conn()); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", lockKey(schema)); err != nil {
		return nil, fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtextextended($1, 0))", lockKey(schema))
	}()
	t := tables.For(schema)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+t.QuotedSchema); err != nil {
		return nil, fmt.Errorf("migrate: create schema %s: %w", schema, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+t.Migrations+" (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn, schema)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var done []int
	for _, m := range All() {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL(schema)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+t.Migrations+" (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("migrate: version %d (%s): %w", m.Version, m.Name, err)
		}
		done = append(done, m.Version)
	}
	return done, nil
}

// Missing returns the embedded versions that schema's schema_migrations does not record, in
// order: every version when the schema or the table does not exist yet. It only reads.
func Missing(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", tables.For(schema).Migrations).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: look for %s: %w", tables.For(schema).Migrations, err)
	}
	applied := map[int]bool{}
	if exists {
		var err error
		if applied, err = appliedVersions(ctx, pool, schema); err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
	}
	var missing []int
	for _, m := range All() {
		if !applied[m.Version] {
			missing = append(missing, m.Version)
		}
	}
	return missing, nil
}

// appliedVersions reads the versions schema.schema_migrations records (the table must exist).
func appliedVersions(ctx context.Context, q pg.Querier, schema string) (map[int]bool, error) {
	rows, err := q.Query(ctx, "SELECT version FROM "+tables.For(schema).Migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied versions: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read applied versions: %w", err)
	}
	applied := make(map[int]bool, len(vs))
	for _, v := range vs {
		applied[v] = true
	}
	return applied, nil
}
