// Package tooltest finds the command-line tools some tests run (promtool,
// helm), which scripts/test.sh installs on a fresh machine.
package tooltest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv, when set to a non-empty value, makes a missing tool a test
// failure instead of a skip (scripts/test.sh sets it once it has installed
// the tools).
const RequireEnv = "LEAPGATE_REQUIRE_TOOLS"

// Path returns the path of the command name: on PATH, or in the go
// command's install directory (GOBIN, else GOPATH/bin), where scripts/test.sh
// installs it. Without it the test is skipped with what to run, or fails
// when RequireEnv is set.
func Path(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range installDirs() {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	msg := name + " is not installed: `make test` installs it (see scripts/test.sh for the version)"
	if os.Getenv(RequireEnv) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + "; skipping")
	return ""
}

// installDirs are where `go install` puts commands.
func installDirs() []string {
	if b := os.Getenv("GOBIN"); b != "" {
		return []string{b}
	}
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var dirs []string
	if len(lines) > 0 && strings.TrimSpace(lines[0]) != "" {
		dirs = append(dirs, strings.TrimSpace(lines[0]))
	}
	if len(lines) > 1 {
		for _, p := range filepath.SplitList(strings.TrimSpace(lines[1])) {
			dirs = append(dirs, filepath.Join(p, "bin"))
		}
	}
	return dirs
}
