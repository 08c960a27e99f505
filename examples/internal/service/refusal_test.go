package service

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"testing"

	"github.com/kafkatx/kafkatx/pg"
)

// Issue 48, defect 7: the example binaries that register Flags (orders, dagtrigger) print
// SessionRefusal's remedy behind a transaction pooler; every flag it names is one of theirs,
// and it replaces the library's remedy (kafkatx.Config fields a binary's user cannot set).
func TestSessionRefusalNamesRegisteredFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var f Flags
	f.Register(fs, Flags{}, "orders")
	lib := fmt.Errorf("kafkatx: migrate: %w; apply them ... Config.SkipMigrations", pg.ErrTransactionPooled)
	err := SessionRefusal(lib)
	if !errors.Is(err, pg.ErrTransactionPooled) || regexp.MustCompile(`SkipMigrations`).MatchString(err.Error()) {
		t.Fatalf("SessionRefusal = %v", err)
	}
	names := regexp.MustCompile(`--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(err.Error(), -1)
	if len(names) == 0 {
		t.Fatalf("no flag named: %v", err)
	}
	for _, m := range names {
		if fs.Lookup(m[1]) == nil {
			t.Errorf("SessionRefusal names --%s, which Flags does not register", m[1])
		}
	}
	if other := errors.New("other"); SessionRefusal(other) != other {
		t.Error("SessionRefusal changed an error that is not a pooler's refusal")
	}
}
