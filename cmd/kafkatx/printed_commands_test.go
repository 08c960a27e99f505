package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/outbox"
)

// parseStep parses step, a printed `kafkatx ...` command with its placeholders filled in,
// with the CLI's own parser: an unknown flag, a flag value of the wrong shape or a missing
// required flag (kong's validation) is an error.
func parseStep(step string) error {
	var cli CLI
	p, err := kong.New(&cli, kong.Name("kafkatx"), cliVars(), kong.Exit(func(int) {}))
	if err != nil {
		return err
	}
	_, err = p.Parse(shellWords(strings.TrimPrefix(step, "kafkatx ")))
	return err
}

// shellWords splits s as a shell would a line of plain words and single-quoted strings.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in, has := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			in, has = !in, true
		case r == ' ' && !in:
			if has {
				words = append(words, w.String())
			}
			w.Reset()
			has = false
		default:
			w.WriteRune(r)
			has = true
		}
	}
	if has {
		words = append(words, w.String())
	}
	return words
}

// fillPlaceholders gives a printed command's placeholders (GROUP, TOPIC, TEXT, '...', URL,
// format verbs) values of the shape the operator would type.
func fillPlaceholders(step string) string {
	return strings.NewReplacer("--outbox-mode %s", "--outbox-mode table", "%d", "1", "%s", "x", "%q", "x", "%v", "x",
		"'...'", "why", "GROUP", "g", "TOPIC", "t", "TEXT", "why", "URL", "postgres://h/db").Replace(step)
}

// printedCommand is a command a message prints: "kafkatx", a command path and its words up to
// where the command ends in the sentence (a backtick, ";", ")", " (", ", ", " or ", " then",
// " —" or the end). A word after that is prose.
var printedCommand = regexp.MustCompile("kafkatx (?:migrate|offsets|relay|outbox|dlq|console|listen) [^`;)\n—]*?(?:`|;|\\)| \\(|, | or | then|: |\\.\\s|\\.$|$)")

// commandsIn returns the printed commands in s, trimmed of the text that ends them.
func commandsIn(s string) []string {
	var out []string
	for _, m := range printedCommand.FindAllString(s, -1) {
		for _, suf := range []string{"`", ";", ")", " (", ", ", " or ", " then", ": ", ". ", "."} {
			m = strings.TrimSuffix(m, suf)
		}
		out = append(out, strings.TrimSpace(m))
	}
	return out
}

// notSteps are commands a message names without being a step to run as printed: the name of
// a command (for its output or its kind), or alternatives. Each says why.
var notSteps = map[string]string{
	"kafkatx outbox parked|release|discard":                   "names three commands, no step",
	"kafkatx offsets reset --mode adopt":                      "names the adopt mode; the halt's error prints the whole command after it",
	"kafkatx offsets status":                                  "names the report to read, whose group the operator is looking at",
	"kafkatx offsets audit":                                   "names the audit to read",
	"kafkatx dlq list":                                        "names where dead letter ids come from",
	"kafkatx outbox parked":                                   "names where row ids come from",
	"kafkatx migrate up --outbox-mode wal":                    "names the command that set WAL mode (help text), no step",
	"kafkatx migrate up --outbox-mode table":                  "names the command that set table mode (help text), no step",
	"kafkatx offsets reset --mode skip":                       "names a half-applied skip; the step follows",
	"kafkatx relay --migrate":                                 "an alternative to the migrate step, complete as printed",
	"kafkatx outbox release|discard":                          "names two commands, no step",
	"kafkatx outbox drop-slot drops it":                       "help text naming the command",
	"kafkatx migrate up --outbox-mode wal recreates it":       "help text naming the command",
	"kafkatx offsets audit shows this halt with the range":    "names the audit to read",
	"kafkatx offsets reset --schema %s --group %s --topic %s": "offsetstate.ResetCommand, the start every reset step is built from (TestPrintedBuiltCommandsParse parses the steps)",
}

// Issue 48 (F3): the relay's lost-slot error printed `kafkatx offsets reset ... --mode replay
// --execute`, which exits 2 (missing --reason). Every command the library, cmd/ and
// examples/ print — each string constant of their non-test Go files, constant concatenations
// folded — is parsed by the CLI's own parser with its placeholders filled in: an unknown flag
// or a missing required flag fails here. Commands built at run time (outbox.RecoverSlotSteps,
// offsetstate.ResetStep) are parsed as printed by TestEveryPrintedRecoveryStepRecovers and
// TestPrintedBuiltCommandsParse.
func TestEveryPrintedCommandParses(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ast.Inspect(f, func(n ast.Node) bool {
			s, ok := constString(n)
			if !ok {
				// A + with a value known only at run time: its literals are fragments of a
				// command built there (TestPrintedBuiltCommandsParse).
				return !isConcat(n)
			}
			for _, c := range commandsIn(s) {
				if _, ok := notSteps[c]; ok {
					continue
				}
				checked++
				if err := parseStep(fillPlaceholders(c)); err != nil {
					t.Errorf("%s prints %q, which the CLI refuses: %v", rel, c, err)
				}
			}
			return false // a folded concatenation is checked once
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked %d printed commands: the scan finds too few", checked)
	}
	t.Logf("%d printed commands parsed", checked)
}

// constString folds n, a string literal or a + of them, into its value.
func constString(n ast.Node) (string, bool) {
	switch e := n.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, ok1 := constString(e.X)
		r, ok2 := constString(e.Y)
		return l + r, ok1 && ok2
	case *ast.ParenExpr:
		return constString(e.X)
	}
	return "", false
}

// isConcat says whether n is a + of strings.
func isConcat(n ast.Node) bool {
	e, ok := n.(*ast.BinaryExpr)
	return ok && e.Op == token.ADD
}

// The commands built at run time, each parsed as printed (placeholders filled): the slot's
// recovery steps, the mode-switch steps, and the lost slot's replay reset (issue 48, F3: it
// lacked --reason).
func TestPrintedBuiltCommandsParse(t *testing.T) {
	var texts []string
	texts = append(texts, outbox.RecoverSlotSteps("orders", true), outbox.RecoverSlotSteps("", false))
	for _, from := range []outbox.Mode{outbox.ModeTable, outbox.ModeWAL} {
		for _, to := range []outbox.Mode{outbox.ModeTable, outbox.ModeWAL} {
			texts = append(texts, outbox.SwitchSteps("orders", from, to))
		}
	}
	texts = append(texts, offsetstate.ResetStep("orders", "GROUP", "TOPIC", -1, "--to-time 2026-12-07T13:29:30Z", "replay", msgfmt.Quote),
		offsetstate.ResetStep("", "g", "t", 2, "--to-offset 5", "skip", msgfmt.Quote))
	n := 0
	for _, s := range texts {
		for _, c := range commandsIn(s) {
			n++
			if err := parseStep(fillPlaceholders(c)); err != nil {
				t.Errorf("printed %q (in %q): the CLI refuses it: %v", c, s, err)
			}
		}
	}
	if n < len(texts) {
		t.Fatalf("found %d commands in %d texts", n, len(texts))
	}
}
