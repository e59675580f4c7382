// Command figures re-measures the figures of the docs (`make figures`): it
// runs the command of every figure block of docs/benchmarks.md,
// docs/accuracy.md and docs/rlqs.md (see internal/figures) from the repository's root, and
// writes its output into the block under a stamp naming the command, the
// commit, the date, the CPU and the Go version. -only limits it to the
// blocks whose command matches a regular expression. Run it on an idle
// machine: the figures are only as quiet as it is.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/leapgate/leapgate/internal/figures"
)

// docs are the files that hold measured figures.
var docs = []string{"docs/benchmarks.md", "docs/accuracy.md", "docs/rlqs.md"}

func main() {
	only := flag.String("only", "", "run only the blocks whose command matches this regular expression")
	timeout := flag.Duration("timeout", 20*time.Minute, "longest one command may run")
	flag.Parse()
	if err := run(*only, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "figures:", err)
		os.Exit(1)
	}
}

func run(only string, timeout time.Duration) error {
	match, err := regexp.Compile(only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	commit := gitCommit()
	date := time.Now().UTC().Format("2006-01-02")
	cpu := cpuName()
	for _, path := range docs {
		doc, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var failed error
		out, err := figures.Rewrite(string(doc), func(b figures.Block) (string, string, bool) {
			if failed != nil || !match.MatchString(b.Command) {
				return "", "", false
			}
			fmt.Fprintf(os.Stderr, "== %s: %s\n", path, b.Command)
			output, err := measure(b.Command, timeout)
			if err != nil {
				failed = fmt.Errorf("%s: %s: %w", path, b.Command, err)
				return "", "", false
			}
			return figures.Stamp(b.Command, commit, date, cpu, runtime.Version()), output, true
		})
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			return err
		}
		if failed != nil {
			return failed
		}
	}
	return nil
}

// measure runs command with bash and returns its standard output, without
// go test's PASS and ok lines.
func measure(command string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", err
	}
	var kept []string
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "PASS" || strings.HasPrefix(line, "ok  \t") || strings.HasPrefix(line, "ok \t") {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n"), sc.Err()
}

// gitCommit returns the short commit of the work tree, with "-dirty" when it
// has changes.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		commit += "-dirty"
	}
	return commit
}

// cpuName returns the CPU's model name and the number of CPUs.
func cpuName() string {
	name := runtime.GOARCH
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				name = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s × %d", name, runtime.NumCPU())
}
