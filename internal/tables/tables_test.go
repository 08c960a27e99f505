package tables

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const tableNames = `(watermarks|attempts|dead_letters|offset_audit|outbox|idempotency_keys|schema_migrations|dlq_audit|outbox_audit|outbox_commits|idempotency_responses|done_offsets|outbox_settings|partition_samples|airflow_ledger|airflow_pending|key_parking|shard_directory|outbox_emit|outbox_set_mode)\b`

// handBuilt match a schema-qualified name built outside For: a pgx.Identifier of two parts, a
// quoted schema followed by ".name", quote_ident($1) || '.name', a %s.name format, or the
// default schema written out in SQL.
var handBuilt = []*regexp.Regexp{
	regexp.MustCompile(`pgx\.Identifier\{[^}]*,[^}]*\}`),
	regexp.MustCompile("\\.Sanitize\\(\\)\\s*\\+\\s*[`\"]\\." + tableNames),
	regexp.MustCompile(`quote_ident\([^)]*\)\s*\|\|\s*'\.`),
	regexp.MustCompile(`%s\.` + tableNames),
	regexp.MustCompile(`(?i)(FROM|INTO|UPDATE|TABLE|JOIN)\s+"?kafkatx"?\.` + tableNames),
	regexp.MustCompile("\\+\\s*[`\"]\\." + tableNames),
}

// handBuiltIn returns the hand-built names in src, comments aside.
func handBuiltIn(src string) []string {
	var code strings.Builder
	for _, l := range strings.Split(src, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "//") {
			code.WriteString(l + "\n")
		}
	}
	src = code.String()
	var found []string
	for _, re := range handBuilt {
		found = append(found, re.FindAllString(src, -1)...)
	}
	return found
}

// notTables are files whose matches name no table: the reason for each.
var notTables = map[string]string{
	"outbox/channel.go": "the NOTIFY channel \"<schema>.outbox\", which must equal the migrations' outbox_channel()",
}

// TestNamesAreBuiltOnlyHere checks that no Go source of the module outside this package (its
// tests aside) builds a schema-qualified name of kafkatx's tables or functions by hand: For is
// the one place.
func TestNamesAreBuiltOnlyHere(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Base(filepath.Dir(path)) == "tables" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		if _, ok := notTables[rel]; ok {
			return nil
		}
		for _, m := range handBuiltIn(string(b)) {
			t.Errorf("%s builds a table name by hand (%s): use tables.For", rel, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The check itself.
	for _, bad := range []string{
		`pgx.Identifier{schema, "dlq_audit"}.Sanitize()`,
		"`SELECT ` + pgx.Identifier{s}.Sanitize() + `.outbox_emit($1)`",
		`to_regclass(quote_ident($1) || '.outbox')`,
		`fmt.Sprintf("SELECT version FROM %s.schema_migrations", id)`,
		"`SELECT count(*) FROM kafkatx.outbox`",
		`quoteIdent(schema) + ".outbox"`,
	} {
		if len(handBuiltIn(bad)) == 0 {
			t.Errorf("the check missed %s", bad)
		}
	}
}
