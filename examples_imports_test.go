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
// takes along), as `go list -deps` resolves them in the examples' own module (issue 43:
// examples/go.mod, which requires the library and github.com/kafkatx/kafkatx/cmd), imports
// no internal package of the library or of the command's module: only examples/internal.
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports", "./...")
	cmd.Dir = "examples"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in examples/: %v", err)
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
			if !strings.HasPrefix(imp, module) || strings.HasPrefix(imp, module+"examples/internal/") {
				continue
			}
			if rest := strings.TrimPrefix(imp, module); strings.HasPrefix(rest, "internal/") || strings.Contains(rest, "/internal/") || strings.HasSuffix(rest, "/internal") {
				t.Errorf("%s imports %s: a copy of the example outside this repository cannot build; make what it needs public API or move it under examples/internal", p.ImportPath, imp)
			}
		}
	}
	if seen < 5 {
		t.Fatalf("go list found %d packages under examples/, want the binaries and examples/internal", seen)
	}
}
