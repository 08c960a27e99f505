package kafkatx

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// apiNames returns the exported names of the package in dir: "Name" for each top-level
// declaration, "Type.Field" and "Type.Method" for struct fields and methods.
func apiNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					names[id.Name+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								for _, n := range fl.Names {
									names[s.Name.Name+"."+n.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					}
				}
			}
		}
	}
	return names
}

// Issue 48, defect 10: every Go name docs/api.md shows exists in the code — qualified by one
// of the packages the page covers (kafkatx.X, outbox.X.Y, ...) or a type's field or method
// (Config.Retry, Message.Header).
func TestAPIPageNamesExist(t *testing.T) {
	page, err := os.ReadFile("docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]map[string]bool{}
	for _, p := range []string{"kafkatx", "outbox", "idempotency", "kafkatxtest"} {
		dir := p
		if p == "kafkatx" {
			dir = "."
		}
		pkgs[p] = apiNames(t, dir)
	}
	name := regexp.MustCompile(`^([A-Za-z]\w*(?:\.[A-Z]\w*)+)(\(.*\))?$`)
	checked := 0
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(page), -1) {
		for _, tok := range strings.Split(m[1], ", ") {
			n := name.FindStringSubmatch(strings.TrimSuffix(tok, ")"))
			if n == nil {
				n = name.FindStringSubmatch(tok)
			}
			if n == nil {
				continue
			}
			parts := strings.SplitN(n[1], ".", 2)
			found := false
			switch names, ok := pkgs[parts[0]]; {
			case ok:
				found = names[parts[1]]
			case parts[0][0] >= 'A' && parts[0][0] <= 'Z':
				for _, names := range pkgs {
					found = found || names[n[1]]
				}
			default:
				continue // a local variable's method (tx.Commit) or another module's name
			}
			checked++
			if !found {
				t.Errorf("docs/api.md names %s, which the code does not have", n[1])
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d names checked: the page's form changed?", checked)
	}
}
