package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The kafkatx binary the tests run, built once per test binary: a cgo link of librdkafka
// takes 10 to 20 s on a loaded 2-core machine, and 30 tests each built their own.
var cli struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cli.dir != "" {
		_ = os.RemoveAll(cli.dir)
	}
	os.Exit(code)
}

// buildCLI returns the path of this command built (once, shared by every test of the package;
// read-only to them) into a temporary directory removed when the tests end.
func buildCLI(t *testing.T) string {
	t.Helper()
	cli.once.Do(func() {
		cli.dir, cli.err = os.MkdirTemp("", "kafkatx-cli-")
		if cli.err != nil {
			return
		}
		cli.path = filepath.Join(cli.dir, "kafkatx")
		if out, err := exec.Command("go", "build", "-o", cli.path, ".").CombinedOutput(); err != nil {
			cli.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if cli.err != nil {
		t.Fatalf("build kafkatx: %v", cli.err)
	}
	return cli.path
}
