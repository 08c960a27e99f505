package devservices

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The Makefile's KAFKA2_TESTS is a list of test names run against the second Kafka line; a
// renamed or deleted test would silently shrink that subset (go test -run matches nothing and
// passes). Every name in it must name a test function in KAFKA2_PKGS, and a pattern ending in
// .* must match at least one.
func TestKafka2SubsetNamesTests(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KAFKA2_TESTS \?= \^\(([^)]*)\)\$\$$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no line KAFKA2_TESTS ?= ^(A|B|...)$$")
	}
	p := regexp.MustCompile(`(?m)^KAFKA2_PKGS \?= (.*)$`).FindSubmatch(mk)
	if p == nil {
		t.Fatal("Makefile: no line KAFKA2_PKGS ?= ...")
	}
	funcs := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)
	for _, pkg := range strings.Fields(string(p[1])) {
		files, err := filepath.Glob(filepath.Join("..", "..", pkg, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("KAFKA2_PKGS %s: no test files (%v)", pkg, err)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decl.FindAllSubmatch(src, -1) {
				funcs[string(d[1])] = true
			}
		}
	}
	names := strings.Split(string(m[1]), "|")
	if len(names) < 10 {
		t.Fatalf("KAFKA2_TESTS names %d tests, want the subset (at least 10)", len(names))
	}
	for _, name := range names {
		prefix, isPattern := strings.CutSuffix(name, ".*")
		found := false
		for f := range funcs {
			if f == name || (isPattern && strings.HasPrefix(f, prefix)) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("KAFKA2_TESTS names %s, which is no test function in KAFKA2_PKGS (renamed or removed?)", name)
		}
	}
}
