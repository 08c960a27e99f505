package main

import (
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// Issue "liveness" 6: without a broker address the example ran on its in-process broker (said
// in one info line) and exited 0 having processed nothing from the real cluster. Now it
// refuses with exit 2 and one line, unless --in-process-broker asks for it.
func TestRefusesToRunWithoutABrokerUnlessAskedForTheInProcessOne(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinary(t, "orders")
	for _, tc := range []struct {
		args []string
		env  string
		want string // in the one line
	}{
		{args: []string{"--database-url", "postgres://nowhere/x"}, want: "--in-process-broker"},
		{args: []string{"--in-process-broker"}, env: "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092", want: "--in-process-broker"},
		{args: []string{"--in-process-broker", "--generate", "-5"}, want: "--generate"},
		{args: []string{"--in-process-broker", "--max-outbox-rows", "-1"}, want: "--max-outbox-rows"},
		{args: []string{"--in-process-broker", "--crash-every", "-1"}, want: "--crash-every"},
		// Issue "a user's first week" 5: bad values were replaced by defaults.
		{args: []string{"--in-process-broker", "--batch-size", "-5"}, want: "--batch-size -5: want 1 to 100,000"},
		{args: []string{"--in-process-broker", "--max-attempts", "0"}, want: "--max-attempts 0: want 1 to 1,000"},
		{args: []string{"--in-process-broker", "--exit-when-idle", "-1s"}, want: "--exit-when-idle -1s: a duration must not be negative"},
		{args: []string{"--in-process-broker", "--session-timeout", "-2s"}, want: "--session-timeout"},
		{args: []string{"--in-process-broker", "--partitions", "0"}, want: "--partitions 0"},
		{args: []string{"--in-process-broker", "--batch-size", "lots"}, want: "batch-size"},
		{args: []string{"--in-process-broker", "--on-log-change", "follow"}, want: "--on-log-change \"follow\": want halt, adopt-earliest or adopt-latest"},
		// Issue 48, F6: a database URL that does not parse (given, or in $DATABASE_URL) exits 2
		// before anything connects (it was exit 1), without showing the password.
		{args: []string{"--in-process-broker", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x?pool_max_conns=abc"}, want: "--database-url: the database URL does not parse"},
		{args: []string{"--in-process-broker", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus"}, want: "--database-url: the database URL does not parse"},
		{args: []string{"--in-process-broker"}, env: "DATABASE_URL=postgres://u:s3cret@[::1", want: "--database-url: the database URL does not parse"},
		{args: []string{"--in-process-broker", "--session-database-url", "host=x port=abc password=s3cret"}, want: "--session-database-url: the database URL does not parse"},
		// --shard NAME=URL: the flag package quoted a refused value — a shard URL with its
		// password — in its error; shards.ParseSpecs refuses after parsing, naming the shard.
		{args: []string{"--in-process-broker", "--shard", "a=postgres://u:s3cret@127.0.0.1:1/x?sslmode=bogus"}, want: "--shard a: the database URL does not parse"},
		{args: []string{"--in-process-broker", "--shard", "postgres://u:s3cret@127.0.0.1:1/x"}, want: "--shard 1: "},
		{args: []string{"--in-process-broker", "--shard", "a=postgres://u:s3cret@h/x", "--shard", "a=postgres://u:s3cret@h/y"}, want: `shard "a" named twice`},
		// A fresh-eyes attack: a stray word ("--batch-size 10 5000") was ignored.
		{args: []string{"--in-process-broker", "--batch-size", "10", "5000"}, want: "unexpected argument \"5000\""},
	} {
		testenv.RequireUsageError(t, bin, tc.args, []string{"KAFKA_BOOTSTRAP_SERVERS=", tc.env}, tc.want)
	}
}
