package migrations

import (
	"io/fs"
	"strings"
	"testing"
)

// TestVersionsAreUniqueAndContiguous needs no services: the embedded files are numbered 1, 2,
// 3, … with no gap and no number used twice (two branches that each add "006_…" fail here
// before they fail a deployment), each with a name.
func TestVersionsAreUniqueAndContiguous(t *testing.T) {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, e := range entries {
		num, _, _ := strings.Cut(e.Name(), "_")
		if len(num) != 3 {
			t.Errorf("%s: want a three-digit version prefix (NNN_name.sql)", e.Name())
		}
		if prev, dup := seen[num]; dup {
			t.Errorf("version %s used by %s and %s", num, prev, e.Name())
		}
		seen[num] = e.Name()
	}
	all := All()
	if len(all) != len(entries) {
		t.Fatalf("All() returned %d migrations for %d files", len(all), len(entries))
	}
	for i, m := range all {
		if m.Version != i+1 {
			t.Errorf("migration %d of %d has version %d; want %d (no gaps)", i+1, len(all), m.Version, i+1)
		}
		if m.Name == "" || strings.TrimSpace(m.SQL("kafkatx")) == "" {
			t.Errorf("version %d: empty name or SQL", m.Version)
		}
	}
	if Latest() != len(all) {
		t.Errorf("Latest() = %d; want %d", Latest(), len(all))
	}
}
