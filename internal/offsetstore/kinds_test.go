package offsetstore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"strconv"
	"strings"
	"testing"
)

// TestKindsListsEveryKind checks that Kinds, which the CLI's help and the console read, holds
// every Kind constant of this package once.
func TestKindsListsEveryKind(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]bool{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if !strings.HasPrefix(n.Name, "Kind") || i >= len(vs.Values) {
							continue
						}
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
							v, _ := strconv.Unquote(lit.Value)
							consts[v] = true
						}
					}
				}
			}
		}
	}
	if len(consts) == 0 {
		t.Fatal("no Kind constants found")
	}
	seen := map[string]bool{}
	for _, k := range Kinds {
		if seen[k.Kind] {
			t.Errorf("Kinds lists %q twice", k.Kind)
		}
		seen[k.Kind] = true
		if !consts[k.Kind] {
			t.Errorf("Kinds lists %q, which no Kind constant names", k.Kind)
		}
	}
	for c := range consts {
		if !seen[c] {
			t.Errorf("Kind constant %q is missing from Kinds", c)
		}
	}
}
