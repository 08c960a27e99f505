package kafkatxtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAUserModuleTestsItsHandlerWithTheKit runs the tests of testdata/usermod, a module of its
// own (example.com/shipping, kafkatx replaced by this repository) as a new user writes one:
// its handler's tests use only kafkatxtest and DATABASE_URL — no PostgreSQL code of their own,
// no Kafka — and see a Permanent failure dead-lettered, an ordinary failure counted as an
// attempt (then a dead letter at the last attempt), and a panic captured. It also checks that
// the user's test binary does not compile the in-process broker (franz-go's kfake).
func TestAUserModuleTestsItsHandlerWithTheKit(t *testing.T) {
	t.Parallel()
	if os.Getenv("DATABASE_URL") == "" {
		// New skips or fails the same way inside the module; here, say so before building.
		t.Log("DATABASE_URL is not set: the module's tests skip (or fail under CI)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	dir, err := filepath.Abs(filepath.Join("testdata", "usermod"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out.String())
		}
		return out.String()
	}
	if deps := run("list", "-deps", "-test", "./..."); strings.Contains(deps, "franz-go") || !strings.Contains(deps, "github.com/kafkatx/kafkatx/kafkatxtest\n") {
		t.Fatalf("the user's test binary should build kafkatxtest and not franz-go:\n%s", deps)
	}
	// -race like make test, so the build reuses the suite's cached packages.
	out := run("test", "-race", "-count=1", "-v", "./...")
	for _, test := range []string{
		"TestShipmentRequestedForAPaidOrder", "TestNotJSONIsDeadLetteredAtOnce",
		"TestMissingAddressIsAnAttemptThenADeadLetter", "TestAPanicIsCapturedAsAnAttempt",
	} {
		if !strings.Contains(out, "--- PASS: "+test+" ") {
			t.Errorf("%s did not pass in the user module:\n%s", test, out)
		}
	}
	if !strings.Contains(out, "captured: handler panicked: assignment to entry in nil map") {
		t.Errorf("the panic's message is not in the output:\n%s", out)
	}
}
