package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// builds holds what BuildOnce built in this test binary, by package.
var builds struct {
	mu  sync.Mutex
	dir string
	by  map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// BuildOnce builds the Go command pkg (a package path as `go build` takes it, relative to the
// test's working directory, e.g. "." or "../dagservice") into a binary called name, once per
// test binary: every later call, from any test, returns the same path. A cgo link of librdkafka
// takes 10 to 20 s on a loaded 2-core machine; a package whose tests each built the command
// spent minutes linking. The binary is shared: run it, never change it. It lives in a temporary
// directory that RemoveBuilds removes (call it from TestMain after m.Run). A failed build fails
// every test that asks for it, with go build's output.
func BuildOnce(t testing.TB, pkg, name string) string {
	t.Helper()
	builds.mu.Lock()
	if builds.by == nil {
		builds.by = map[string]*build{}
	}
	key := pkg + "\x00" + name
	b := builds.by[key]
	if b == nil {
		b = &build{}
		builds.by[key] = b
	}
	if builds.dir == "" {
		d, err := os.MkdirTemp("", "kafkatx-test-bin-")
		if err != nil {
			builds.mu.Unlock()
			t.Fatalf("testenv: build %s: %v", pkg, err)
		}
		builds.dir = d
	}
	dir := builds.dir
	builds.mu.Unlock()
	b.once.Do(func() {
		sub, err := os.MkdirTemp(dir, "b-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(sub, name)
		if out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("testenv: go build -o %s %s: %v", name, pkg, b.err)
	}
	return b.path
}

// RemoveBuilds removes the binaries BuildOnce built. Call it from TestMain after m.Run.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir, builds.by = "", nil
	}
}
