package testenv

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// QueryExecModes maps each query exec mode pgx v5 offers, by the name the URL parameter
// default_query_exec_mode gives it, to its pgx value. kafkatx's statements must work in every
// one: exec and simple_protocol are what a transaction pooler such as PgBouncer needs
// (pg.ParsePoolConfig picks exec there), and in both pgx sends each argument as text without
// a type, so PostgreSQL reads it with the type it infers from the statement.
var QueryExecModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// QueryExecModeNames lists QueryExecModes' names in a fixed order (pgx's default first).
var QueryExecModeNames = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// PostgresInMode is Postgres with every connection of the pool in the query exec mode named
// mode (a key of QueryExecModes; an unknown name fails the test).
func PostgresInMode(t testing.TB, mode string) *pgxpool.Pool {
	t.Helper()
	m, ok := QueryExecModes[mode]
	if !ok {
		t.Fatalf("testenv: unknown query exec mode %q", mode)
	}
	return connectWith(t, DatabaseURL(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = m })
}
