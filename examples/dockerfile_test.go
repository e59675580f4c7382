package examples

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dockerStage is one FROM ... AS name stage of a Dockerfile.
type dockerStage struct {
	Name, Base string
	Instrs     []dockerInstr
}

// dockerInstr is one instruction with continuation lines joined.
type dockerInstr struct {
	Cmd, Args string
	Line      int
}

// parseDockerfile splits a Dockerfile into stages and instructions. It
// handles comments, blank lines and backslash continuations, which is all
// the Leapgate Dockerfile uses.
func parseDockerfile(data []byte) ([]*dockerStage, error) {
	var stages []*dockerStage
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	n := 0
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := dockerInstr{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Line: start}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			st := &dockerStage{Base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.Name = f[2]
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			return fmt.Errorf("line %d: %s before FROM", start, in.Cmd)
		}
		st := stages[len(stages)-1]
		st.Instrs = append(st.Instrs, in)
		return nil
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // comment inside a continuation
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return stages, sc.Err()
}

func (s *dockerStage) all(cmd string) []dockerInstr {
	var out []dockerInstr
	for _, in := range s.Instrs {
		if in.Cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// exposed returns the ports a stage EXPOSEs.
func (s *dockerStage) exposed() []string {
	var ports []string
	for _, in := range s.all("EXPOSE") {
		for _, p := range strings.Fields(in.Args) {
			ports = append(ports, strings.TrimSuffix(p, "/tcp"))
		}
	}
	return ports
}

// copiedFromBuild returns the destination paths of the files a stage copies
// from another stage (COPY --from=x src... dst/).
func (s *dockerStage) copiedFromBuild() []string {
	var out []string
	for _, in := range s.all("COPY") {
		f := strings.Fields(in.Args)
		if len(f) < 3 || !strings.HasPrefix(f[0], "--from=") {
			continue
		}
		dst := f[len(f)-1]
		for _, src := range f[1 : len(f)-1] {
			if strings.HasSuffix(dst, "/") {
				out = append(out, dst+path.Base(src))
			} else {
				out = append(out, dst)
			}
		}
	}
	return out
}

// dockerignoreMatch reports whether a slash path relative to the build
// context is excluded by one of the patterns (Docker's syntax: a leading
// "**/" matches any depth, a pattern also excludes everything below a
// matched directory).
func dockerignoreMatch(patterns []string, rel string) bool {
	parts := strings.Split(rel, "/")
	for _, p := range patterns {
		anyDepth := strings.HasPrefix(p, "**/")
		p = strings.TrimPrefix(p, "**/")
		pp := strings.Split(p, "/")
		for start := 0; start < len(parts); start++ {
			if start > 0 && !anyDepth {
				break
			}
			if len(parts)-start < len(pp) {
				break
			}
			ok := true
			for i, seg := range pp {
				if m, _ := path.Match(seg, parts[start+i]); !m {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}

func readDockerignore(t *testing.T) []string {
	t.Helper()
	var pats []string
	for _, line := range strings.Split(string(readFile(t, "../.dockerignore")), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			pats = append(pats, line)
		}
	}
	return pats
}

func loadDockerfile(t *testing.T) map[string]*dockerStage {
	t.Helper()
	stages, err := parseDockerfile(readFile(t, "../Dockerfile"))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	byName := map[string]*dockerStage{}
	for _, s := range stages {
		byName[s.Name] = s
	}
	byName[""] = stages[len(stages)-1] // the default target
	return byName
}

// execForm parses a JSON exec-form argument list (["a", "b"]).
func execForm(args string) []string {
	args = strings.TrimSpace(args)
	if !strings.HasPrefix(args, "[") {
		return nil
	}
	var out []string
	for _, f := range strings.Split(strings.Trim(args, "[]"), ",") {
		out = append(out, strings.Trim(strings.TrimSpace(f), `"`))
	}
	return out
}

// TestDockerfile checks the image recipe: a static build of packages that
// exist, small non-root final images whose ENTRYPOINT and HEALTHCHECK name
// binaries the stage contains, and a context that keeps the sources.
func TestDockerfile(t *testing.T) {
	stages := loadDockerfile(t)
	build := stages["build"]
	if build == nil {
		t.Fatal("no build stage")
	}
	var env, runs string
	for _, in := range build.all("ENV") {
		env += " " + in.Args
	}
	for _, in := range build.all("RUN") {
		runs += " " + in.Args
	}
	if !strings.Contains(env, "CGO_ENABLED=0") {
		t.Error("build stage does not set CGO_ENABLED=0: the binary would not be static")
	}
	var built []string
	for _, f := range strings.Fields(runs) {
		if strings.HasPrefix(f, "./cmd/") {
			built = append(built, f)
			dir := filepath.Join("..", filepath.FromSlash(f))
			goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			if len(goFiles) == 0 {
				t.Errorf("Dockerfile builds %s, which has no Go files", f)
			}
		}
	}
	if len(built) < 3 {
		t.Errorf("build stage builds %v; want ratelimit, healthprobe, demo-upstream", built)
	}
	ignore := readDockerignore(t)
	for _, pkg := range built {
		rel := strings.TrimPrefix(pkg, "./")
		if dockerignoreMatch(ignore, rel) || dockerignoreMatch(ignore, rel+"/main.go") {
			t.Errorf(".dockerignore excludes %s, which the image builds", pkg)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if dockerignoreMatch(ignore, f) {
			t.Errorf(".dockerignore excludes %s", f)
		}
	}
	// Every source and embedded file of the module the built commands need
	// must reach the build context.
	for _, f := range moduleFilesOf(t, built) {
		if dockerignoreMatch(ignore, f) {
			t.Errorf(".dockerignore excludes %s, which the image's build needs", f)
		}
	}

	for _, name := range []string{"ratelimit", "demo-upstream"} {
		t.Run(name, func(t *testing.T) {
			s := stages[name]
			if s == nil {
				t.Fatalf("no stage %q", name)
			}
			if !strings.HasPrefix(s.Base, "gcr.io/distroless/static") && s.Base != "scratch" {
				t.Errorf("base image %s: want distroless/static or scratch", s.Base)
			}
			users := s.all("USER")
			if len(users) == 0 {
				t.Error("no USER: the container would run as root")
			} else if u := users[len(users)-1].Args; u == "root" || strings.HasPrefix(u, "0") {
				t.Errorf("USER %s is root", u)
			}
			copied := s.copiedFromBuild()
			has := func(bin string) bool {
				for _, c := range copied {
					if c == bin {
						return true
					}
				}
				return false
			}
			eps := s.all("ENTRYPOINT")
			if len(eps) != 1 || len(execForm(eps[0].Args)) == 0 || !has(execForm(eps[0].Args)[0]) {
				t.Errorf("ENTRYPOINT %v does not run a binary the stage copies (%v)", eps, copied)
			}
			hcs := s.all("HEALTHCHECK")
			if len(hcs) != 1 {
				t.Fatalf("want one HEALTHCHECK, got %d", len(hcs))
			}
			_, cmd, ok := strings.Cut(hcs[0].Args, "CMD ")
			argv := execForm(cmd)
			if !ok || len(argv) < 2 || !has(argv[0]) {
				t.Errorf("HEALTHCHECK %q must use exec form with a binary of the stage (%v): distroless has no shell", hcs[0].Args, copied)
			}
		})
	}
	if stages[""] != stages["ratelimit"] {
		t.Error("the default (last) stage must be the ratelimit service")
	}
	// Drop-in: the binary also where envoyproxy/ratelimit's image has it;
	// the version reaches the binary and the image's labels.
	svc := stages["ratelimit"]
	if !slices.Contains(svc.copiedFromBuild(), "/bin/ratelimit") {
		t.Errorf("the service image has no /bin/ratelimit (copies %v)", svc.copiedFromBuild())
	}
	if !strings.Contains(runs, "server.linkedVersion=${VERSION}") {
		t.Error("the build does not link VERSION into the binary (server.linkedVersion)")
	}
	var labels string
	for _, in := range svc.all("LABEL") {
		labels += " " + in.Args
	}
	// The licence label names the repository's LICENSE.
	if license := string(readFile(t, "../LICENSE")); !strings.Contains(license, "Apache License") || !strings.Contains(license, "Version 2.0") {
		t.Error("LICENSE is not the Apache License 2.0 the image's label names")
	}
	for _, l := range []string{"org.opencontainers.image.version=\"${VERSION}\"", "org.opencontainers.image.source=", "org.opencontainers.image.title=", "org.opencontainers.image.licenses=\"Apache-2.0\""} {
		if !strings.Contains(labels, l) {
			t.Errorf("the service image has no label %s (labels: %s)", l, labels)
		}
	}
}

// moduleFilesOf lists, relative to the repository root, the Go and embedded
// files of this module that the packages pkgs depend on.
func moduleFilesOf(t *testing.T, pkgs []string) []string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"list", "-e", "-deps", "-f", `{{if not .Standard}}{{.Dir}}|{{join .GoFiles ","}},{{join .EmbedFiles ","}}{{end}}`}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", pkgs, err)
	}
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, names, ok := strings.Cut(line, "|")
		rel, err := filepath.Rel(root, dir)
		if !ok || err != nil || strings.HasPrefix(rel, "..") {
			continue // another module
		}
		for _, n := range strings.Split(names, ",") {
			if n != "" {
				files = append(files, filepath.ToSlash(filepath.Join(rel, n)))
			}
		}
	}
	if len(files) == 0 {
		t.Fatalf("go list found no files for %v", pkgs)
	}
	return files
}

func TestDockerignoreMatch(t *testing.T) {
	pats := []string{".git", "**/testdata", "**/*_test.go", "*.md", "examples"}
	tests := []struct {
		path string
		want bool
	}{
		{".git/config", true},
		{"descriptors/testdata/a.yaml", true},
		{"service/ratelimit_test.go", true},
		{"README.md", true},
		{"docs/x.md", false},
		{"examples/envoy/envoy.yaml", true},
		{"cmd/ratelimit/main.go", false},
		{"go.mod", false},
	}
	for _, tt := range tests {
		if got := dockerignoreMatch(pats, tt.path); got != tt.want {
			t.Errorf("dockerignoreMatch(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestParseDockerfileRejectsInstructionBeforeFrom(t *testing.T) {
	if _, err := parseDockerfile([]byte("RUN true\nFROM scratch\n")); err == nil {
		t.Fatal("RUN before FROM accepted")
	}
	if _, err := os.Stat("../Dockerfile"); err != nil {
		t.Fatal(err)
	}
}
