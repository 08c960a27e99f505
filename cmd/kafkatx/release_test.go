package main

import (
	"os"
	"regexp"
	"testing"
)

// Issue "a user's first week" 1: a version to depend on. The README's `go get` and `go install`
// name the newest version the CHANGELOG has a section for (Keep a Changelog: "## [X.Y.Z] -
// YYYY-MM-DD" under "## [Unreleased]"), with its link reference, so a release cannot update
// one and forget the other.
func TestReadmeInstallsTheNewestChangelogVersion(t *testing.T) {
	t.Parallel()
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## \[Unreleased\]$`).Match(changelog) {
		t.Error("CHANGELOG.md has no ## [Unreleased] section")
	}
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$`).FindSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no released section (## [X.Y.Z] - YYYY-MM-DD)")
	}
	v := string(m[1])
	for _, want := range []string{
		`go get github.com/kafkatx/kafkatx@v` + v,
		`go install github.com/kafkatx/kafkatx/cmd/kafkatx@v` + v,
	} {
		if !regexp.MustCompile(regexp.QuoteMeta(want) + `\b`).Match(readme) {
			t.Errorf("README.md does not show %q (the CHANGELOG's newest version)", want)
		}
	}
	if !regexp.MustCompile(`(?m)^\[` + regexp.QuoteMeta(v) + `\]: https://`).Match(changelog) {
		t.Errorf("CHANGELOG.md has no link reference for [%s]", v)
	}
}
