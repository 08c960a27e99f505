package kafkatx

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// Issue 31 "The examples build outside the repository": a user who copies an example into a
// module of their own can build it only if it imports public packages of kafkatx. Every
// package under examples/ (the binaries and examples/internal, which a copy of examples/
// takes along), as `go list -deps` resolves them, imports no package of kafkatx's internal/.
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports", "./examples/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/kafkatx/kafkatx/"
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.ImportPath, module+"examples/") {
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"internal/") {
				t.Errorf("%s imports %s: a copy of the example outside this repository cannot build; make what it needs public API or move it under examples/internal", p.ImportPath, imp)
			}
		}
	}
	if seen < 5 {
		t.Fatalf("go list found %d packages under examples/, want the binaries and examples/internal", seen)
	}
}
