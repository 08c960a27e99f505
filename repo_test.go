package kafkatx

import (
	"bytes"
	"encoding/binary"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRepositoryStandsAlone: users clone this repository alone, so no file in it may point
// at a sibling directory of the clone (the project's planning folder sits beside it on the
// developers' machines, and links into it came back once with a merge), and what a clone
// carries is source: no build output, no large file (trackedFilesAreSource).
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
	t.Run("no tracked binary or file over 1 MiB", trackedFilesAreSource)
}

// trackedFilesAreSource: issue 43 "the house kept": a 31.6 MB compiled dagtrigger binary sat
// at the repository's root (commit 6414d0f), and every clone carries it in its history. No
// tracked file may be a compiled binary (ELF, Mach-O or PE), and none may be over 1 MiB
// except the docs' images (docs/**.png, .jpg, .jpeg, .svg).
func trackedFilesAreSource(t *testing.T) {
	if err := exec.Command("git", "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		t.Skipf("not a git checkout (%v): tracked files cannot be listed", err)
	}
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	const limit = 1 << 20
	seen := 0
	for _, path := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree but not yet from the index, or a symlink
		}
		seen++
		if info.Size() > limit && !docsImage(path) {
			t.Errorf("%s is %d bytes: a tracked file over 1 MiB outside the docs' images", path, info.Size())
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 4096)
		n, _ := io.ReadFull(f, head)
		f.Close()
		if kind := executableFormat(head[:n]); kind != "" {
			t.Errorf("%s is a compiled %s binary: build outputs are not tracked (git rm --cached it; .gitignore its name)", path, kind)
		}
	}
	if seen < 100 {
		t.Fatalf("git ls-files listed %d files, want the repository's", seen)
	}
}

// docsImage reports whether path is an image under docs/, the one kind of large file kept.
func docsImage(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png", ".jpg", ".jpeg", ".svg":
		return strings.HasPrefix(filepath.ToSlash(path), "docs/")
	}
	return false
}

// executableFormat names the executable format whose magic number head starts with (ELF,
// Mach-O, PE), or "".
func executableFormat(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "ELF"
	case len(head) >= 4 && slices.Contains([]uint32{0xfeedface, 0xfeedfacf, 0xcafebabe}, binary.BigEndian.Uint32(head)),
		len(head) >= 4 && slices.Contains([]uint32{0xfeedface, 0xfeedfacf}, binary.LittleEndian.Uint32(head)):
		return "Mach-O"
	case bytes.HasPrefix(head, []byte("MZ")) && len(head) >= 0x40:
		// A PE file: the DOS header's e_lfanew (offset 0x3c) points at "PE\0\0".
		if off := int(binary.LittleEndian.Uint32(head[0x3c:])); off+4 <= len(head) && string(head[off:off+4]) == "PE\x00\x00" {
			return "PE"
		}
	}
	return ""
}

// Issue 43: the library, cmd/ and examples/ are modules of their own, and `make test` covers
// each through the Makefile's MODULES (scripts/go-modules); a module missing from it would go
// untested, its tests passing by not running. MODULES names every go.mod the repository
// tracks outside testdata.
func TestMakefileModulesAreTheRepositorysModules(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(string(mk), "\n") {
		if v, ok := strings.CutPrefix(line, "MODULES ?= "); ok {
			listed = strings.Fields(v)
		}
	}
	if listed == nil {
		t.Fatal("Makefile: no line MODULES ?= ...")
	}
	var found []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".dev", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "go.mod" {
			found = append(found, filepath.ToSlash(filepath.Dir(path)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	slices.Sort(found)
	if !slices.Equal(listed, found) {
		t.Errorf("Makefile's MODULES %v, want the directories holding a go.mod outside testdata: %v", listed, found)
	}
}
