package main

import (
	"os"
	"testing"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// buildCLI returns this command built once for every test of the package (testenv.BuildOnce).
func buildCLI(t *testing.T) string {
	t.Helper()
	return testenv.BuildOnce(t, ".", "kafkatx")
}
