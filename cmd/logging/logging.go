// Package logging builds the zap logger of kafkatx's binaries (the kafkatx command and the
// examples), which log to stderr: human-readable console lines (ISO 8601 time, level, logger,
// message, fields) when stderr is a terminal, one JSON object per line otherwise (a file, a
// pipe, a log collector), with ISO 8601 timestamps in both. KAFKATX_LOG_FORMAT=console or
// json decides instead of the terminal test. Stack traces are added only to panics, not to
// every error line. A package of the command's module (github.com/kafkatx/kafkatx/cmd), not of
// the library: public so that a copy of an example builds outside this repository.
package logging

import (
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

// FormatEnv names the environment variable that overrides the format: console or json.
const FormatEnv = "KAFKATX_LOG_FORMAT"

// Format returns the format New uses: FormatEnv's value when it is console or json, else
// console when stderr is a terminal (a character device) and json otherwise.
func Format() string {
	switch f := strings.ToLower(strings.TrimSpace(os.Getenv(FormatEnv))); f {
	case "console", "json":
		return f
	}
	if isTerminal(os.Stderr) {
		return "console"
	}
	return "json"
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// New returns a logger writing to stderr at level (debug, info, warn or error; "" is
// info) in Format's format. An unknown level is an error.
func New(level string) (*zap.Logger, error) {
	lvl := zapcore.InfoLevel
	if level != "" {
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
		}
	}
	return build(Format(), lvl, zapcore.Lock(os.Stderr)), nil
}

// Must is New for a level the caller already checked; on an error it returns a logger at
// info level.
func Must(level string) *zap.Logger {
	log, err := New(level)
	if err != nil {
		log, _ = New("")
	}
	return log
}

func build(format string, lvl zapcore.Level, out zapcore.WriteSyncer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	if format == "console" {
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		ec.ConsoleSeparator = "  "
		enc = zapcore.NewConsoleEncoder(ec)
	} else {
		enc = zapcore.NewJSONEncoder(ec)
	}
	return zap.New(zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(lvl)),
		zap.AddCaller(), zap.AddStacktrace(zapcore.DPanicLevel), zap.ErrorOutput(out))
}
