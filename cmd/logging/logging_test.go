package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

type buf struct{ bytes.Buffer }

func (*buf) Sync() error { return nil }

// Issue "a user's first week" 7: the binaries printed JSON with epoch timestamps and a stack
// trace under every error line, even on a terminal.
func TestConsoleLinesForPeopleJSONForMachines(t *testing.T) {
	var c buf
	build("console", zapcore.InfoLevel, &c).Error("relay stopped", zap.String("topic", "orders"), zap.Error(errors.New("boom")))
	line := c.String()
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[Z+-][0-9:]*  ERROR  `).MatchString(line) ||
		!strings.Contains(line, "relay stopped") || !strings.Contains(line, `"topic": "orders"`) || strings.Count(line, "\n") != 1 {
		t.Fatalf("console line %q: want one line, ISO 8601 time, level, message and fields, no stack trace", line)
	}
	var j buf
	build("json", zapcore.InfoLevel, &j).Error("relay stopped", zap.String("topic", "orders"))
	var m map[string]any
	if err := json.Unmarshal(j.Bytes(), &m); err != nil {
		t.Fatalf("json line %q: %v", j.String(), err)
	}
	if ts, _ := m["ts"].(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT`).MatchString(ts) || m["stacktrace"] != nil || m["topic"] != "orders" {
		t.Fatalf("json line %v: want an ISO 8601 ts, the fields, no stack trace", m)
	}
	var d buf
	build("json", zapcore.InfoLevel, &d).Debug("hidden")
	if d.Len() != 0 {
		t.Fatalf("a debug line at info level: %q", d.String())
	}
}

func TestFormatFollowsTheEnvironmentThenTheTerminal(t *testing.T) {
	t.Setenv(FormatEnv, "console")
	if Format() != "console" {
		t.Fatal("KAFKATX_LOG_FORMAT=console ignored")
	}
	t.Setenv(FormatEnv, "JSON")
	if Format() != "json" {
		t.Fatal("KAFKATX_LOG_FORMAT=JSON ignored")
	}
	t.Setenv(FormatEnv, "")
	if want := map[bool]string{true: "console", false: "json"}[isTerminal(os.Stderr)]; Format() != want {
		t.Fatalf("format %s, want %s (stderr a terminal: %v)", Format(), want, isTerminal(os.Stderr))
	}
	if isTerminal(os.Stdin) && isTerminal(mustOpen(t, os.DevNull)) {
		t.Fatal("/dev/null taken for a terminal")
	}
	if _, err := New("loud"); err == nil {
		t.Fatal("an unknown level was accepted")
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
