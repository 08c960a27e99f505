package main

import (
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "a user's first week" 5: a bad value is refused with exit 2 and one line naming the
// flag and its range, before anything starts, instead of being replaced by a default.
func TestBadFlagValuesExit2WithOneLine(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinary(t, "dagtrigger")
	for args, want := range map[*[]string]string{
		&[]string{"--brokers", "127.0.0.1:1", "--batch-size", "-5"}: "--batch-size -5: want 1 to 100,000",
		&[]string{"--max-attempts", "0"}:                            "--max-attempts 0: want 1 to 1,000",
		&[]string{"--exit-when-idle", "-3s"}:                        "--exit-when-idle -3s: a duration must not be negative",
		&[]string{"--airflow-timeout", "0s"}:                        "--airflow-timeout 0s: want 100ms to 10m0s",
		&[]string{"--airflow-wait-max", "-1m"}:                      "--airflow-wait-max -1m0s",
		&[]string{"--key-retention", "soon"}:                        "key-retention",
		// Issue 48, F6: a --database-url that does not parse exits 2 before anything
		// connects (it was exit 1), without showing the password.
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus"}: "--database-url: the database URL does not parse",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--database-url", "postgres://u:s3cret@[::1"}:                        "--database-url: the database URL does not parse",
		// A fresh-eyes attack: refused before anything connects (they exited 1 after, or
		// were accepted: a DAG id with ".." was resolved into another API path).
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "ü/../x"}: "--dag-id",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", ".."}:     "only dots",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "ftp://x", "--dag-id", "d"}:                 "--airflow-url: want the Airflow API server's http(s) base URL",
		// Credentials in the URL: exit 2 as kafkatx's commands do (it was 1), never quoted back.
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://u:s3cret@127.0.0.1:1", "--dag-id", "d"}:                                      "--airflow-url: credentials in the URL are refused",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "ftp://u:s3cret@x", "--dag-id", "d"}:                                                 "--airflow-url: want the Airflow API server's http(s) base URL",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "not a url", "--dag-id", "d"}:                                                        "--airflow-url",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--cdc-ops", "x"}:                             "--cdc-ops: unknown op",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--cdc-ops", ""}:                              "--cdc-ops names no op",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--cdc-delete-before", "x"}:                   "--cdc-delete-before",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--airflow-token-file", "/nonexistent/token"}: "--airflow-token-file",
		// Issue 44: exactly one target, a DAG or an asset.
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1"}:                                  "--dag-id or --asset is required",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "--asset", "a"}: "--dag-id and --asset exclude each other",
		&[]string{"--topic", "t", "--group", "g", "--airflow-url", "http://127.0.0.1:1", "--dag-id", "d", "stray"}:        "unexpected argument \"stray\"",
	} {
		testenv.RequireUsageError(t, bin, *args, nil, want)
	}
}
