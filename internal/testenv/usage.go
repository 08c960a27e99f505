package testenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// BuildBinary builds the main package in the test's working directory into a temporary file
// named name and returns its path.
func BuildBinary(t testing.TB, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// RequireUsageError runs bin with args (env added to the environment) and fails t unless it
// exits 2 (the binaries' usage error) with nothing on stdout and exactly one line on stderr
// that contains want: the project's rule for a bad flag value (issue "a user's first week" 5).
// No output may contain "s3cret", the tests' stand-in for a secret in a file or value.
func RequireUsageError(t testing.TB, bin string, args, env []string, want string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	name := filepath.Base(bin)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("%s %q: %v, want exit 2", name, args, err)
		return
	}
	if strings.Contains(out.String()+errOut.String(), "s3cret") {
		t.Errorf("%s %q: the output shows a secret: stdout %q stderr %q", name, args, out.String(), errOut.String())
	}
	if lines := strings.Split(strings.TrimSpace(errOut.String()), "\n"); len(lines) != 1 || out.Len() != 0 || !strings.Contains(lines[0], want) {
		t.Errorf("%s %q: want one line with %q, got stdout %q stderr %q", name, args, want, out.String(), errOut.String())
	}
}

// BuildPackage builds the command of the package at import path pkg (such as
// "github.com/kafkatx/kafkatx/cmd/kafkatx") into the test's temporary directory.
func BuildPackage(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// flagRe matches a long flag named in a message: --name.
var flagRe = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// RequireOnlyAcceptedFlags fails t unless every --flag that msg (a binary's printed refusal
// or hint) names appears in bin's --help output (run with helpArgs before --help, e.g. a
// subcommand), and msg names at least one: a hint must name what that binary's user can pass.
func RequireOnlyAcceptedFlags(t testing.TB, bin string, msg string, helpArgs ...string) {
	t.Helper()
	help, _ := exec.Command(bin, append(helpArgs, "--help")...).CombinedOutput()
	named := flagRe.FindAllStringSubmatch(msg, -1)
	if len(named) == 0 {
		t.Errorf("%s: the message names no flag: %s", filepath.Base(bin), msg)
	}
	for _, m := range named {
		if !regexp.MustCompile(`(^|[\s,])--?` + regexp.QuoteMeta(m[1]) + `([\s=,]|$)`).Match(help) {
			t.Errorf("%s: the message names --%s, which the binary does not accept:\n%s", filepath.Base(bin), m[1], msg)
		}
	}
}
