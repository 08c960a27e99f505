// Package docs holds no code: its tests check that README.md and docs/*.md point at things
// that exist — the names of design.md's code maps, the SQLSTATE table of failures.md, and
// every test a document cites.
package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx/internal/pgerr"
)

const root = ".."

// index is what the module's Go sources declare.
type index struct {
	pkgs    map[string]map[string]bool // package name → its top-level names
	members map[string]map[string]bool // type name → its methods and fields (every package)
	qual    map[string]map[string]bool // "pkg.Type" → its methods and fields
	names   map[string]bool            // every top-level name, method and field
	tests   map[string]bool            // every func Test... in a _test.go file
	files   map[string]bool            // every file's base name
	// declared maps a name as the code maps write it (Name, Type.member, pkg.Name,
	// pkg.Type.member) to the files, relative to the root, that declare it.
	declared map[string][]string
}

// parseModule parses every .go file under the repository's root (not testdata, not hidden
// directories).
func parseModule(t *testing.T) *index {
	t.Helper()
	ix := &index{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{},
		qual: map[string]map[string]bool{}, names: map[string]bool{}, tests: map[string]bool{}, files: map[string]bool{}, declared: map[string][]string{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		ix.files[d.Name()] = true
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		isTest := strings.HasSuffix(path, "_test.go")
		pkg := f.Name.Name
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		declare := func(keys ...string) {
			for _, k := range keys {
				ix.declared[k] = append(ix.declared[k], rel)
			}
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if isTest && d.Recv == nil && strings.HasPrefix(d.Name.Name, "Test") {
					ix.tests[d.Name.Name] = true
				}
				if isTest {
					continue
				}
				ix.names[d.Name.Name] = true
				if d.Recv == nil {
					add(ix.pkgs, pkg, d.Name.Name)
					declare(d.Name.Name, pkg+"."+d.Name.Name)
					continue
				}
				typ := receiverType(d.Recv.List[0].Type)
				add(ix.members, typ, d.Name.Name)
				add(ix.qual, pkg+"."+typ, d.Name.Name)
				declare(d.Name.Name, typ+"."+d.Name.Name, pkg+"."+typ+"."+d.Name.Name)
			case *ast.GenDecl:
				if isTest {
					continue
				}
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							ix.names[n.Name] = true
							add(ix.pkgs, pkg, n.Name)
							declare(n.Name, pkg+"."+n.Name)
						}
					case *ast.TypeSpec:
						ix.names[s.Name.Name] = true
						add(ix.pkgs, pkg, s.Name.Name)
						declare(s.Name.Name, pkg+"."+s.Name.Name)
						for _, m := range membersOf(s.Type) {
							ix.names[m] = true
							add(ix.members, s.Name.Name, m)
							add(ix.qual, pkg+"."+s.Name.Name, m)
							declare(m, s.Name.Name+"."+m, pkg+"."+s.Name.Name+"."+m)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// membersOf returns a struct's fields or an interface's methods.
func membersOf(e ast.Expr) []string {
	var list *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return nil
	}
	var out []string
	for _, f := range list.List {
		for _, n := range f.Names {
			out = append(out, n.Name)
		}
		if len(f.Names) == 0 { // embedded
			if n := receiverType(f.Type); n != "" {
				out = append(out, n)
			} else if s, ok := f.Type.(*ast.SelectorExpr); ok {
				out = append(out, s.Sel.Name)
			}
		}
	}
	return out
}

// notGo are names the code maps cite that are not Go: Kafka properties and placeholders.
var notGo = map[string]bool{
	"transactional.id": true, "max.message.bytes": true, "cleanup.policy": true,
	"XxxDefault": true, "…": true,
}

var (
	ident     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	signature = regexp.MustCompile(`^([A-Za-z_]\w*)\(\) \w+$`) // Unavailable() bool
	backticks = regexp.MustCompile("`([^`]+)`")
)

// check returns why name, a backticked name of a code map, points at nothing, or "".
func (ix *index) check(name string) string {
	switch {
	case notGo[name], strings.Contains(name, "<"), strings.HasPrefix(name, "-"), strings.HasPrefix(name, "/"):
		return "" // placeholders, flags, URL paths
	case signature.MatchString(name):
		if m := signature.FindStringSubmatch(name)[1]; !ix.names[m] {
			return "no method " + m
		}
		return ""
	case strings.ContainsAny(name, " |"):
		return "" // prose in backticks
	case strings.HasSuffix(name, ".md"):
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			return "no file " + name
		}
		return ""
	case strings.Contains(name, "/") || strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".sql"):
		if !strings.Contains(name, "/") {
			if !ix.files[name] {
				return "no file " + name
			}
			return ""
		}
		if m, _ := filepath.Glob(filepath.Join(root, name)); len(m) == 0 {
			return "no file or directory " + name
		}
		return ""
	case strings.Contains(name, "_") && strings.ToLower(name) == name:
		return "" // a table, column or SQL function
	}
	if strings.HasPrefix(name, "Test") && ident.MatchString(name) {
		if !ix.tests[name] {
			return "no test " + name
		}
		return ""
	}
	if p, ok := strings.CutSuffix(name, "*"); ok && ident.MatchString(p) {
		for n := range ix.names {
			if strings.HasPrefix(n, p) {
				return ""
			}
		}
		return "no name starts with " + p
	}
	seg := strings.Split(name, ".")
	for _, s := range seg {
		if !ident.MatchString(s) {
			return "not a Go name"
		}
	}
	switch len(seg) {
	case 1:
		if !ix.names[name] && ix.pkgs[name] == nil {
			return "declared nowhere"
		}
	case 2:
		if ix.pkgs[seg[0]][seg[1]] {
			return ""
		}
		if ix.members[seg[0]][seg[1]] {
			return ""
		}
		switch {
		case ix.pkgs[seg[0]] != nil:
			return "package " + seg[0] + " declares no " + seg[1]
		case ix.members[seg[0]] != nil:
			return "type " + seg[0] + " has no method or field " + seg[1]
		}
		return "no package or type " + seg[0]
	case 3:
		if !ix.qual[seg[0]+"."+seg[1]][seg[2]] {
			return seg[0] + "." + seg[1] + " has no method or field " + seg[2]
		}
	default:
		return "not a Go name"
	}
	return ""
}

// section returns the lines of md from the heading that starts with title to the next
// heading of the same or a higher level.
func section(t *testing.T, md, title string) string {
	t.Helper()
	lines := strings.Split(md, "\n")
	start, level := -1, 0
	for i, l := range lines {
		h := strings.TrimLeft(l, "#")
		n := len(l) - len(h)
		if n == 0 || !strings.HasPrefix(h, " ") {
			continue
		}
		if start < 0 && strings.HasPrefix(strings.TrimSpace(h), title) {
			start, level = i, n
			continue
		}
		if start >= 0 && n <= level {
			return strings.Join(lines[start:i], "\n")
		}
	}
	if start < 0 {
		t.Fatalf("no section %q", title)
	}
	return strings.Join(lines[start:], "\n")
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// brokenCodeMapNames returns the backticked names of design.md's code maps that point at
// nothing, each with why.
func brokenCodeMapNames(ix *index, design string, t *testing.T) []string {
	var broken []string
	for _, title := range []string{"Code map: one message's path", "Code map: one outbox record's path, by mode"} {
		sec := section(t, design, title)
		for _, m := range backticks.FindAllStringSubmatch(sec, -1) {
			if why := ix.check(m[1]); why != "" {
				broken = append(broken, fmt.Sprintf("%s (%s)", m[1], why))
			}
		}
		// A table row's names are declared in the files the row names.
		for _, l := range strings.Split(sec, "\n") {
			cols := strings.Split(l, " | ")
			if len(cols) != 3 || !strings.HasPrefix(l, "| ") {
				continue
			}
			var files []string
			for _, f := range backticks.FindAllStringSubmatch(cols[1], -1) {
				files = append(files, f[1])
			}
			for _, n := range backticks.FindAllStringSubmatch(cols[2], -1) {
				where := ix.declared[n[1]]
				if len(where) > 0 && !inFiles(where, files) {
					broken = append(broken, fmt.Sprintf("%s (declared in %s, not in the row's %s)", n[1], strings.Join(where, ", "), strings.Join(files, ", ")))
				}
			}
		}
	}
	return broken
}

// inFiles reports whether one of where (paths from the root) is one of files: a path, a
// base name, a directory (with or without its slash) or a glob.
func inFiles(where, files []string) bool {
	for _, w := range where {
		for _, f := range files {
			ok, _ := filepath.Match(f, w)
			if ok || w == f || (!strings.Contains(f, "/") && filepath.Base(w) == f) || strings.HasPrefix(w, strings.TrimSuffix(f, "/")+"/") {
				return true
			}
		}
	}
	return false
}

// TestCodeMapNamesExist checks that every function, method, type, package and file
// docs/design.md's code maps name in backticks exists in the module's sources.
func TestCodeMapNamesExist(t *testing.T) {
	ix := parseModule(t)
	design := read(t, "docs/design.md")
	for _, b := range brokenCodeMapNames(ix, design, t) {
		t.Errorf("docs/design.md's code map names %s", b)
	}
	// The check itself: a name broken on purpose is caught.
	for _, bad := range []string{"`worker.verdictX`", "`kafkaSideX.readCheckpoint`", "`pgstart.AwaitX`", "`walrelay.Relay.runOnceX`", "`internal/engine/nope.go`",
		"\n| Misattributed | `internal/engine/breaker.go` | `lane.verdict` |"} {
		if got := brokenCodeMapNames(ix, "## Code map: one message's path\n"+bad+"\n### Code map: one outbox record's path, by mode\n", t); len(got) != 1 {
			t.Errorf("the check missed %s: %v", bad, got)
		}
	}
}

// TestFailuresTableMatchesPgerr checks docs/failures.md's SQLSTATE table against
// internal/pgerr: each code it lists is classified as the row says and bears the row's
// condition name; each "other NNxxx" is pgerr's class row; every code and class row pgerr
// lists is in the table.
func TestFailuresTableMatchesPgerr(t *testing.T) {
	for _, p := range failuresTableProblems(read(t, "docs/failures.md")) {
		t.Error(p)
	}
	// The check itself: a row that says another class is caught.
	md := strings.Replace(read(t, "docs/failures.md"), "| 53100 | disk_full | Server |", "| 53100 | disk_full | Conflict |", 1)
	if got := failuresTableProblems(md); len(got) != 1 {
		t.Errorf("a wrong class for 53100 gave %v", got)
	}
}

var (
	code     = regexp.MustCompile(`^[0-9A-Z]{5}$`)
	classRow = regexp.MustCompile(`^other ([0-9A-Z]{2})xxx$`)
)

func failuresTableProblems(md string) []string {
	var problems []string
	byCode, byClassRow := pgerr.Listed()
	seenCode, seenRow, otherClasses := map[string]bool{}, map[string]bool{}, false
	in := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| SQLSTATE |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(l, "| ---") {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			if len(seenCode) > 0 {
				break
			}
			continue
		}
		cols := strings.Split(strings.Trim(l, "|"), "|")
		if len(cols) < 3 {
			problems = append(problems, "failures.md: a row of the SQLSTATE table has fewer than 3 columns: "+l)
			continue
		}
		names := strings.TrimSpace(cols[1])
		class := strings.ToLower(strings.Trim(strings.TrimSpace(cols[2]), "*"))
		for _, c := range strings.Split(cols[0], ",") {
			c = strings.TrimSpace(c)
			switch {
			case code.MatchString(c):
				seenCode[c] = true
				d := pgerr.Describe(&pgconn.PgError{Code: c})
				if d.Class.String() != class {
					problems = append(problems, fmt.Sprintf("failures.md: %s is %s, pgerr classifies it %s", c, class, d.Class))
				}
				if d.Name != "" && !strings.Contains(names, d.Name) {
					problems = append(problems, fmt.Sprintf("failures.md: the row of %s does not name %s (pgerr's name)", c, d.Name))
				}
			case classRow.MatchString(c):
				cl := classRow.FindStringSubmatch(c)[1]
				seenRow[cl] = true
				if got := pgerr.Classify(&pgconn.PgError{Code: cl + "ZZZ"}); got.String() != class {
					problems = append(problems, fmt.Sprintf("failures.md: %s is %s, pgerr classifies it %s", c, class, got))
				}
			case c == "every other class":
				otherClasses = true
				if class != pgerr.Statement.String() {
					problems = append(problems, "failures.md: every other class is "+class+", pgerr says statement")
				}
			default:
				problems = append(problems, fmt.Sprintf("failures.md: %q in the SQLSTATE column is neither a code, other NNxxx nor every other class", c))
			}
		}
	}
	var missing []string
	for c := range byCode {
		if !seenCode[c] {
			missing = append(missing, c)
		}
	}
	for c := range byClassRow {
		if !seenRow[c] {
			missing = append(missing, "other "+c+"xxx")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		problems = append(problems, "failures.md's SQLSTATE table lacks "+m+", which internal/pgerr classifies")
	}
	if !otherClasses {
		problems = append(problems, "failures.md's SQLSTATE table has no row for every other class")
	}
	return problems
}

// withoutCodeBlocks drops fenced code blocks: their tests are examples of a user's own.
func withoutCodeBlocks(md string) string {
	var b strings.Builder
	in := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if !in {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

var testName = regexp.MustCompile(`Test[A-Z]\w*(\*)?`)

// missingTests returns the test names doc cites that no _test.go declares. A name ending in
// * is a prefix.
func missingTests(ix *index, doc string) []string {
	var missing []string
	for _, m := range testName.FindAllStringSubmatch(doc, -1) {
		name := strings.TrimSuffix(m[0], "*")
		if m[1] != "" {
			found := false
			for tn := range ix.tests {
				found = found || strings.HasPrefix(tn, name)
			}
			if !found {
				missing = append(missing, m[0])
			}
			continue
		}
		if !ix.tests[name] {
			missing = append(missing, name)
		}
	}
	return missing
}

// TestCitedTestsExist checks that every test README.md and docs/*.md name (Test[A-Z]...)
// is a func in some _test.go of the module.
func TestCitedTestsExist(t *testing.T) {
	ix := parseModule(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range missingTests(ix, withoutCodeBlocks(string(b))) {
			t.Errorf("%s cites %s, which no _test.go declares", strings.TrimPrefix(p, root+"/"), m)
		}
	}
	if got := missingTests(ix, "`TestCitedTestsExistX`, `TestCitedTestsExist`, `TestCited*`"); len(got) != 1 {
		t.Errorf("the check found %v, want only TestCitedTestsExistX", got)
	}
}

// TestOffsetStatesListed checks that design.md's offset vocabulary names every
// offsetstate.State and nothing else.
func TestOffsetStatesListed(t *testing.T) {
	states := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(root, "internal", "offsetstate", "*.go"))
	fset := token.NewFileSet()
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "State" {
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok {
						states[strings.Trim(lit.Value, `"`)] = true
					}
				}
			}
			return true
		})
	}
	if len(states) == 0 {
		t.Fatal("no offsetstate.State constants found")
	}
	for _, p := range offsetVocabularyProblems(read(t, "docs/design.md"), states) {
		t.Error(p)
	}
	if got := offsetVocabularyProblems("- **One vocabulary for offsets.** `aligned`, `kafka_ahed`\n", map[string]bool{"aligned": true, "kafka_ahead": true}); len(got) != 2 {
		t.Errorf("the check found %v, want kafka_ahed named and kafka_ahead missing", got)
	}
}

var stateName = regexp.MustCompile("^[a-z]+(_[a-z]+)+$|^aligned$|^unused$")

func offsetVocabularyProblems(design string, states map[string]bool) []string {
	const head = "- **One vocabulary for offsets.**"
	i := strings.Index(design, head)
	if i < 0 {
		return []string{"design.md has no bullet " + head}
	}
	para := design[i+len(head):]
	if j := strings.Index(para, "\n- **"); j >= 0 {
		para = para[:j]
	}
	var problems []string
	listed := map[string]bool{}
	for _, m := range backticks.FindAllStringSubmatch(para, -1) {
		if !stateName.MatchString(m[1]) || m[1] == "state" {
			continue
		}
		listed[m[1]] = true
		if !states[m[1]] {
			problems = append(problems, "design.md's offset vocabulary names "+m[1]+", which is no offsetstate.State")
		}
	}
	for s := range states {
		if !listed[s] {
			problems = append(problems, "design.md's offset vocabulary lacks offsetstate's "+s)
		}
	}
	sort.Strings(problems)
	return problems
}

// TestGuaranteeRowNamesExist checks that the API names README.md's guarantee rows cite
// (Config.Transaction, Config.CloseTimeout, ...) exist; their tests are TestCitedTestsExist's.
// Names without a capital letter there are Kafka properties, tables and SQL settings.
func TestGuaranteeRowNamesExist(t *testing.T) {
	ix := parseModule(t)
	for _, b := range brokenGuaranteeNames(ix, read(t, "README.md"), t) {
		t.Errorf("README.md's guarantee rows name %s", b)
	}
	if got := brokenGuaranteeNames(ix, "## Guarantees\n| a | `Config.CloseTimeoutX`, `group.instance.id` | `TestX` |\n", t); len(got) != 1 {
		t.Errorf("the check found %v, want Config.CloseTimeoutX alone", got)
	}
}

func brokenGuaranteeNames(ix *index, readme string, t *testing.T) []string {
	var broken []string
	for _, m := range backticks.FindAllStringSubmatch(section(t, readme, "Guarantees"), -1) {
		n := m[1]
		if strings.HasPrefix(n, "Test") || strings.ToLower(n) == n || strings.ContainsAny(n, "-=") {
			continue
		}
		if why := ix.check(n); why != "" {
			broken = append(broken, fmt.Sprintf("%s (%s)", n, why))
		}
	}
	return broken
}

// TestOutageTestCount checks README.md's count of the tests `make test-outages` runs against
// the Makefile's OUTAGE_TESTS, and that each of them exists.
func TestOutageTestCount(t *testing.T) {
	ix := parseModule(t)
	for _, p := range outageProblems(ix, read(t, "Makefile"), read(t, "README.md")) {
		t.Error(p)
	}
	if got := outageProblems(ix, "OUTAGE_TESTS ?= ^(TestOutageTestCount|TestCitedTestsExist)$$\n", "the three tests of the\nMakefile's `OUTAGE_TESTS`"); len(got) != 1 {
		t.Errorf("a wrong count gave %v", got)
	}
}

var (
	outageTests = regexp.MustCompile(`(?m)^OUTAGE_TESTS \?= \^\(([^)]*)\)`)
	outageCount = regexp.MustCompile("the (\\w+) tests of the\\s+Makefile's `OUTAGE_TESTS`")
	numbers     = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
)

func outageProblems(ix *index, makefile, readme string) []string {
	m := outageTests.FindStringSubmatch(makefile)
	if m == nil {
		return []string{"the Makefile has no OUTAGE_TESTS ?= ^(...)"}
	}
	names := strings.Split(m[1], "|")
	var problems []string
	for _, n := range names {
		if !ix.tests[n] {
			problems = append(problems, "OUTAGE_TESTS names "+n+", which no _test.go declares")
		}
	}
	c := outageCount.FindStringSubmatch(readme)
	if c == nil {
		return append(problems, "README.md does not say how many tests of the Makefile's `OUTAGE_TESTS` make test-outages runs")
	}
	if numbers[c[1]] != len(names) {
		problems = append(problems, fmt.Sprintf("README.md says %s tests of OUTAGE_TESTS; the Makefile has %d", c[1], len(names)))
	}
	return problems
}
