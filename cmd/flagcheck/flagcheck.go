// Package flagcheck refuses bad command-line values of kafkatx's binaries (the operator
// command and the examples) with one line naming the flag, the value and the rule, instead of
// silently replacing them with a default or letting PostgreSQL or Kafka refuse (or truncate)
// them later: numbers and durations out of range (the ranges of kafkatx.Config's fields come
// from kafkatx's Bound table), empty names, schema names PostgreSQL would truncate, topic
// names Kafka refuses, unparsable addresses, key=value pairs without "=". The binaries exit 2
// (the usage status) on its errors, before anything connects. A package of the command's module
// (github.com/kafkatx/kafkatx/cmd), not of the library: public so that a copy of
// an example builds outside this repository.
package flagcheck

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"github.com/kafkatx/kafkatx/pg"
)

// Int returns an error unless lo <= v <= hi: "--name v: want lo to hi".
func Int(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s %d: want %s to %s", name, v, Thousands(lo), Thousands(hi))
	}
	return nil
}

// DatabaseURL returns an error unless v is empty or a PostgreSQL connection string
// pg.ParseConfig accepts: a postgres:// URL or key=value pairs whose parameters pgx knows and
// can read (sslmode, default_query_exec_mode, pool_max_conns, port, ...). The error is
// "--name: " and pg's reason (pg.ErrUnparsableDSN, pg.ErrAmbiguousURL), which never quotes the
// string, since any part of it may be the password. It does not connect; the binaries call
// it before they do, and exit 2.
func DatabaseURL(name, v string) error {
	if v == "" {
		return nil
	}
	if _, err := pg.ParseConfig(v); err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	return nil
}

// Duration returns an error unless lo <= v <= hi: "--name v: want lo to hi"; a negative
// value is named as such.
func Duration(name string, v, lo, hi time.Duration) error {
	if v < 0 && lo >= 0 {
		return fmt.Errorf("--%s %v: a duration must not be negative; want %v to %v", name, v, lo, hi)
	}
	if v < lo || v > hi {
		return fmt.Errorf("--%s %v: want %v to %v", name, v, lo, hi)
	}
	return nil
}

// First returns the first non-nil error, so a binary reports one line.
func First(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Thousands writes n with thousands separators (100,000), as the docs and every bound's
// message do (msgfmt.Thousands, the library's rule).
func Thousands(n int) string { return msgfmt.Thousands(n) }

// Parse parses args with fs (made with flag.ContinueOnError) the way the binaries report
// usage errors: -h or --help prints the usage to stderr and returns (0, false); a bad flag or
// value prints one line, "<fs.Name()>: <what> (see <fs.Name()> --help)", instead of the whole
// usage, and returns (2, false), as does an argument that is not a flag (the binaries take
// flags only); success returns (0, true).
func Parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	usage := fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(os.Stderr)
	fs.Usage = usage
	switch {
	case err == nil && fs.NArg() > 0:
		// The binaries take flags only: a stray word (a value whose flag was dropped, a typo'd
		// "-- flag") would otherwise be ignored while the run goes on without it.
		fmt.Fprintf(os.Stderr, "%s: unexpected argument %q: this command takes flags only (see %s --help)\n", fs.Name(), fs.Arg(0), fs.Name())
		return 2, false
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fmt.Fprintf(os.Stderr, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		return 0, false
	}
	fmt.Fprintf(os.Stderr, "%s: %v (see %s --help)\n", fs.Name(), err, fs.Name())
	return 2, false
}
