package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// printedStep matches a command a message prints for the operator: "kafkatx" and its words up
// to the end of the step (a backtick, ";", ")", " (", ", " or the end of the line).
var printedStep = regexp.MustCompile("kafkatx (?:migrate|offsets|relay|outbox|dlq|console) [^`;)\n]*?(?:`|;|\\)| \\(|, |$)")

// printedSteps returns the commands the error line of a failed command's stderr (its last
// line "kafkatx: ...") prints, in order, without those that recover something other than the
// state (placeholders an operator fills in: GROUP, TOPIC, TEXT).
func printedSteps(stderr string) []string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	msg := lines[len(lines)-1]
	var steps []string
	for _, m := range printedStep.FindAllString(msg, -1) {
		m = strings.TrimRight(strings.TrimSuffix(strings.TrimSuffix(m, " ("), ", "), "`;)")
		if strings.ContainsAny(m, "|'") || regexp.MustCompile(`\b[A-Z]{4,}\b`).MatchString(m) {
			continue
		}
		steps = append(steps, strings.TrimSpace(m))
	}
	return steps
}

// runWith runs the CLI with env added (DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS: what a literal
// step leaves to the operator's environment).
func runWith(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// Issue 48, 3: after a failover left a slot copy the new primary could not stream (58P01), the
// fatal error's step `kafkatx migrate up --outbox-mode wal` exited 0 keeping the same slot, and
// the relay failed the same way again. Every message that prints a recovery step for a state of
// the outbox is followed here literally — the commands it prints, run in order in the
// operator's environment — and the state must be recovered: the command that failed succeeds.
// Own cluster (a WAL segment is removed).
func TestEveryPrintedRecoveryStepRecovers(t *testing.T) {
	brokers := testenv.Brokers(t)
	o := testenv.StartOwnPostgres(t, "")
	bin := buildCLI(t)
	env := []string{"DATABASE_URL=" + o.URL, "KAFKA_BOOTSTRAP_SERVERS=" + brokers, "KAFKATX_SESSION_DATABASE_URL="}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, o.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sqlExec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	slotOf := func(t *testing.T, schema string) string {
		t.Helper()
		var slot string
		if err := pool.QueryRow(ctx, `SELECT slot_name FROM `+schema+`.outbox_settings`).Scan(&slot); err != nil {
			t.Fatal(err)
		}
		return slot
	}
	relay := func(schema string) []string {
		return []string{"--schema", schema, "relay", "--exit-when-idle", "1s"}
	}
	walSchema := func(t *testing.T, schema string) {
		t.Helper()
		if out, stderr, code := runWith(t, bin, env, "--schema", schema, "migrate", "up", "--outbox-mode", "wal"); code != 0 {
			t.Fatalf("migrate up --outbox-mode wal: exit %d %s %s", code, out, stderr)
		}
	}
	for _, c := range []struct {
		name string
		// state makes the state in schema; failing is the command that fails in it.
		state   func(t *testing.T, schema string)
		failing func(schema string) []string
		// steps are the recovery commands the failure must print (checked as printed); the
		// first follow of them (0: all) are the steps, the rest alternatives to them.
		steps  []string
		follow int
		// exit is the exit status of failing once recovered (0, or offsets status's 7 for a
		// group it knows nothing of).
		exit int
		// also: a command that must refuse in the state, printing the same steps.
		also func(schema string) []string
	}{{
		name:    "no tables: relay",
		state:   func(t *testing.T, schema string) {},
		failing: relay,
		steps:   []string{"kafkatx migrate up --schema S", "kafkatx relay --migrate"},
		follow:  1,
	}, {
		name:  "no tables: offsets status",
		state: func(t *testing.T, schema string) {},
		failing: func(schema string) []string {
			return []string{"--schema", schema, "offsets", "status", "--group", "g48"}
		},
		steps: []string{"kafkatx migrate up --schema S"},
		exit:  offsetsExitUnknown,
	}, {
		name: "table mode chosen: relay --outbox-mode wal",
		state: func(t *testing.T, schema string) {
			if _, stderr, code := runWith(t, bin, env, "--schema", schema, "migrate", "up", "--outbox-mode", "table"); code != 0 {
				t.Fatal(stderr)
			}
		},
		failing: func(schema string) []string {
			return []string{"--schema", schema, "relay", "--outbox-mode", "wal", "--exit-when-idle", "1s"}
		},
		// The table rows still pending are published first (a switch with rows pending would
		// leave them to no relay), then the mode switched.
		steps: []string{"kafkatx relay --outbox-mode table --exit-when-idle 5s --schema S", "kafkatx migrate up --outbox-mode wal --schema S"},
	}, {
		name: "slot dropped",
		state: func(t *testing.T, schema string) {
			walSchema(t, schema)
			sqlExec(t, `SELECT pg_drop_replication_slot($1)`, slotOf(t, schema))
		},
		failing: relay,
		steps:   []string{"kafkatx migrate up --outbox-mode wal --schema S"},
	}, {
		name: "publication dropped",
		state: func(t *testing.T, schema string) {
			walSchema(t, schema)
			var pub string
			if err := pool.QueryRow(ctx, `SELECT publication_name FROM `+schema+`.outbox_settings`).Scan(&pub); err != nil {
				t.Fatal(err)
			}
			sqlExec(t, `DROP PUBLICATION `+pub)
		},
		failing: relay,
		steps:   []string{"kafkatx migrate up --outbox-mode wal --schema S"},
	}, {
		// The slot exists and wal_status reads reserved, but the segment of its restart_lsn is
		// gone: what a slot copy on a promoted node after several failovers looks like.
		name: "slot's WAL removed (58P01)",
		state: func(t *testing.T, schema string) {
			walSchema(t, schema)
			slot := slotOf(t, schema)
			var seg string
			if err := pool.QueryRow(ctx, `SELECT pg_walfile_name(restart_lsn) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&seg); err != nil {
				t.Fatal(err)
			}
			sqlExec(t, `CREATE TABLE IF NOT EXISTS filler (g int)`)
			for i := 0; i < 3; i++ {
				sqlExec(t, `INSERT INTO filler SELECT generate_series(1, 100)`)
				sqlExec(t, `SELECT pg_switch_wal()`)
			}
			if err := os.Remove(filepath.Join(o.DataDir(), "pg_wal", seg)); err != nil {
				t.Fatal(err)
			}
		},
		failing: relay,
		steps:   []string{"kafkatx outbox drop-slot --force --schema S", "kafkatx migrate up --outbox-mode wal --schema S"},
		// The step the relay printed before: it exited 0 keeping the slot.
		also: func(schema string) []string {
			return []string{"--schema", schema, "migrate", "up", "--outbox-mode", "wal"}
		},
	}, {
		// Invalidated by max_slot_wal_keep_size (wal_status lost).
		name: "slot invalidated (wal_status lost)",
		state: func(t *testing.T, schema string) {
			walSchema(t, schema)
			slot := slotOf(t, schema)
			sqlExec(t, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
			sqlExec(t, `SELECT pg_reload_conf()`)
			defer func() {
				sqlExec(t, `ALTER SYSTEM RESET max_slot_wal_keep_size`)
				sqlExec(t, `SELECT pg_reload_conf()`)
			}()
			sqlExec(t, `CREATE TABLE IF NOT EXISTS filler (g int)`)
			status := ""
			for i := 0; i < 8 && status != "lost"; i++ {
				sqlExec(t, `INSERT INTO filler SELECT generate_series(1, 100)`)
				sqlExec(t, `SELECT pg_switch_wal()`)
				sqlExec(t, `CHECKPOINT`)
				if err := pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status); err != nil {
					t.Fatal(err)
				}
			}
			if status != "lost" {
				t.Fatalf("slot wal_status %q past max_slot_wal_keep_size, want lost", status)
			}
		},
		failing: relay,
		steps:   []string{"kafkatx outbox drop-slot --force --schema S", "kafkatx migrate up --outbox-mode wal --schema S"},
		also: func(schema string) []string {
			return []string{"--schema", schema, "migrate", "up", "--outbox-mode", "wal"}
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			schema := "r48_" + strings.NewReplacer(" ", "_", ":", "", "'", "", "(", "", ")", "", "-", "_").Replace(strings.ToLower(c.name))
			schema = regexp.MustCompile(`[^a-z0-9_]`).ReplaceAllString(schema, "")
			if len(schema) > 40 {
				schema = schema[:40]
			}
			// The cluster has 4 replication slots (testenv): each case frees its own.
			defer sqlExec(t, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active`)
			c.state(t, schema)
			_, stderr, code := runWith(t, bin, env, c.failing(schema)...)
			if code == 0 {
				t.Fatalf("kafkatx %q exited 0 in the state", c.failing(schema))
			}
			want := make([]string, len(c.steps))
			for i, s := range c.steps {
				want[i] = strings.ReplaceAll(s, " S", " "+schema)
			}
			if got := printedSteps(stderr); !slices.Equal(got, want) {
				t.Fatalf("kafkatx %q printed the steps %q, want %q:\n%s", c.failing(schema), got, want, tailString(stderr, 2000))
			}
			if c.also != nil {
				_, stderr, code := runWith(t, bin, env, c.also(schema)...)
				if code == 0 || !slices.Equal(printedSteps(stderr), want) {
					t.Fatalf("kafkatx %q in the state: exit %d, steps %q, want a refusal printing %q:\n%s", c.also(schema), code, printedSteps(stderr), want, tailString(stderr, 2000))
				}
			}
			if c.follow > 0 {
				want = want[:c.follow]
			}
			for _, step := range want {
				args := strings.Fields(strings.TrimPrefix(step, "kafkatx "))
				if out, stderr, code := runWith(t, bin, env, args...); code != 0 {
					t.Fatalf("printed step %q: exit %d\n%s\n%s", step, code, out, tailString(stderr, 2000))
				}
			}
			if _, stderr, code := runWith(t, bin, env, c.failing(schema)...); code != c.exit {
				t.Fatalf("after the printed steps %q, kafkatx %q still fails (exit %d, want %d):\n%s", want, c.failing(schema), code, c.exit, tailString(stderr, 2000))
			}
		})
	}
}

// The kind of issue 48, 3 in the consumer's halts: the printed `kafkatx offsets reset` named no
// --schema, so followed literally it acted on the default schema, not the consumer's. The
// command a *kafkatx.LogChangedError prints (a recreated topic), run as printed with only its
// reason filled in, lets the consumer start again on the new log.
func TestHaltsPrintedResetRecovers(t *testing.T) {
	b := offsetsSetup(t)
	b.produce("a", "b", "c")
	b.runUntil(3)
	testenv.RecreateTopic(t, b.brokers, b.topic, 1)
	b.produce("x", "y")
	s := b.start()
	var err error
	select {
	case err = <-s.done:
		s.done = nil
	case <-time.After(90 * time.Second):
		t.Fatal("the consumer did not halt on the recreated topic")
	}
	var lce *kafkatx.LogChangedError
	if !errors.As(err, &lce) {
		t.Fatalf("Run returned %v, want a *kafkatx.LogChangedError", err)
	}
	steps := printedStep.FindAllString(err.Error(), -1)
	if len(steps) != 1 {
		t.Fatalf("the halt prints %d commands %q, want 1: %v", len(steps), steps, err)
	}
	step := strings.TrimSuffix(steps[0], "`")
	if !strings.Contains(step, "--reason TEXT") {
		t.Fatalf("printed step %q has no --reason TEXT for the operator to fill in", step)
	}
	args := strings.Fields(strings.TrimPrefix(strings.Replace(step, "--reason TEXT", "--reason recreated", 1), "kafkatx "))
	env := []string{"DATABASE_URL=" + b.dbURL, "KAFKA_BOOTSTRAP_SERVERS=" + b.brokers}
	if out, stderr, code := runWith(t, b.cli, env, args...); code != 0 {
		t.Fatalf("printed step %q: exit %d\n%s\n%s", step, code, out, tailString(stderr, 2000))
	}
	b.runUntil(2) // the new log's two records
}
