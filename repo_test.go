package kafkatx

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepositoryStandsAlone: users clone this repository alone, so no file in it may point
// at a sibling directory of the clone (the project's planning folder sits beside it on the
// developers' machines, and links into it came back once with a merge).
func TestRepositoryStandsAlone(t *testing.T) {
	outside := []byte(".." + "/shared")
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".dev", "node_modules", "__pycache__":
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if i := bytes.Index(b, outside); i >= 0 {
			line := 1 + bytes.Count(b[:i], []byte("\n"))
			t.Errorf("%s:%d points outside the repository (%s)", path, line, strings.TrimSpace(string(outside)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
