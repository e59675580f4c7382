package examples

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/tooltest"
)

// A shell block of the docs (```sh) says how it is checked in the
// comment on the line before it:
//
//	<!-- sh: run -->             run as written (bash -e), to a short timeout
//	<!-- sh: client ENV... -->   run as written against a server the test
//	                             starts with ENV (and a rule directory of
//	                             its own unless ENV says EXAMPLE_RULES=true)
//	<!-- sh: serves [redis] -->  every line starts the service: each must
//	                             become healthy, then stop on SIGTERM
//	                             ("redis": on a redis-server of the test's)
//	<!-- sh: tested TestName --> run by that test
//	<!-- sh: static REASON -->   not run (it needs Docker, Envoy, a cluster,
//	                             or minutes of CPU): the make targets, tools,
//	                             packages and files it names must exist
//
// Every runnable block runs on loopback: the ports the docs use
// (localhost:8080, :8081, :6070, :8082, :6379, :18080, :8000) become free
// ports, in the text and in the settings.

// shellBlock is one ```sh block of a doc.
type shellBlock struct {
	where      string // file:line
	mode, args string
	text       string
}

var shMarker = regexp.MustCompile(`^<!-- sh: (\w+) ?(.*?) -->$`)

// docShellBlocks returns every ```sh and ```bash block of README.md and
// docs/*.md; a block without a marker is an error.
func docShellBlocks(t *testing.T) []shellBlock {
	t.Helper()
	var blocks []shellBlock
	for path, text := range docFiles(t) {
		lines := strings.Split(text, "\n")
		for i := 0; i < len(lines); i++ {
			if lines[i] != "```sh" && lines[i] != "```bash" {
				continue
			}
			b := shellBlock{where: fmt.Sprintf("%s:%d", path, i+1)}
			if i > 0 {
				if m := shMarker.FindStringSubmatch(lines[i-1]); m != nil {
					b.mode, b.args = m[1], m[2]
				}
			}
			var body []string
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				body = append(body, lines[i])
			}
			b.text = strings.Join(body, "\n") + "\n"
			if b.mode == "" {
				t.Errorf("%s: a shell block without a <!-- sh: MODE --> marker", b.where)
				continue
			}
			blocks = append(blocks, b)
		}
	}
	return blocks
}

// TestDocShellBlocks runs or checks every shell block of the docs as its
// marker says.
func TestDocShellBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	blocks := docShellBlocks(t)
	if len(blocks) < 15 {
		t.Fatalf("only %d shell blocks found", len(blocks))
	}
	makefile := string(readFile(t, "../Makefile"))
	for _, b := range blocks {
		t.Run(b.where, func(t *testing.T) {
			switch b.mode {
			case "static":
				if b.args == "" {
					t.Fatal("a static block must say why it is not run")
				}
				checkStatic(t, b, makefile)
			case "tested":
				checkTestExists(t, b.args)
			case "run":
				runBlock(t, b, newPorts(t), nil)
			case "client":
				ports := newPorts(t)
				startDocServer(t, ports, strings.Fields(b.args))
				runBlock(t, b, ports, nil)
			case "serves":
				serveLines(t, b)
			default:
				t.Fatalf("unknown mode %q", b.mode)
			}
		})
	}
}

// docPorts are the ports the docs use, by the setting that chooses them
// ("" for those that are not Leapgate's).
var docPorts = []struct {
	port    int
	setting string
}{{8080, "PORT"}, {8081, "GRPC_PORT"}, {6070, "DEBUG_PORT"}, {8082, "REPORT_PORT"}, {6379, ""}, {18080, ""}, {8000, ""}}

// ports maps each doc port to a free one.
type ports map[int]int

func newPorts(t *testing.T) ports {
	p := ports{}
	free := redistest.FreePorts(t, len(docPorts))
	for i, d := range docPorts {
		p[d.port] = free[i]
	}
	return p
}

// rewrite replaces the doc ports in text with the free ones.
func (p ports) rewrite(text string) string {
	for doc, free := range p {
		text = regexp.MustCompile(`(localhost|127\.0\.0\.1)?:`+strconv.Itoa(doc)+`\b`).
			ReplaceAllString(text, "127.0.0.1:"+strconv.Itoa(free))
	}
	return text
}

// env is the environment of a block or a server: the test's, with the
// listeners on loopback and their free ports.
func (p ports) env(extra ...string) []string {
	env := append(os.Environ(), "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "REPORT_HOST=127.0.0.1")
	for _, d := range docPorts {
		if d.setting != "" {
			env = append(env, d.setting+"="+strconv.Itoa(p[d.port]))
		}
	}
	return append(env, extra...)
}

// startDocServer builds and starts the binary for a client block, with env
// (a rule directory of its own, with a breaker rule for /report, unless
// env has EXAMPLE_RULES=true), and waits until it is healthy.
func startDocServer(t *testing.T, p ports, env []string) {
	t.Helper()
	bin := buildLeapgate(t)
	root := t.TempDir()
	if !strings.Contains(strings.Join(env, " "), "EXAMPLE_RULES=true") {
		writeFile(t, filepath.Join(root, "config", "rules.yaml"), "domain: docs\ndescriptors:\n  - key: destination_cluster\n    value: orders\n    circuit_breaker: {strategy: error_ratio, threshold: 0.5}\n")
	}
	cmd := exec.Command(bin)
	cmd.Env = p.env(append([]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=", "RUNTIME_APPDIRECTORY=config"}, env...)...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("server output:\n%s", out)
		}
	})
	waitHealthy(t, p[8080], out)
}

// buildLeapgate builds ./cmd/ratelimit once per test binary.
var builtLeapgate string

func buildLeapgate(t *testing.T) string {
	t.Helper()
	if builtLeapgate != "" {
		return builtLeapgate
	}
	dir, err := os.MkdirTemp("", "leapgate-docs-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ratelimit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ratelimit")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ratelimit: %v\n%s", err, out)
	}
	builtLeapgate = bin
	return bin
}

// waitHealthy waits until GET /healthcheck on port answers 200.
func waitHealthy(t *testing.T, port int, out fmt.Stringer) {
	t.Helper()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthcheck"
	deadline := time.Now().Add(90 * time.Second) // a go run compiles first
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runBlock runs the block's text with bash -e (ports rewritten) from the
// repository's root, in a process group that is killed at the end, and
// requires it to exit 0 within the timeout.
func runBlock(t *testing.T, b shellBlock, p ports, env []string) {
	t.Helper()
	for _, tool := range []string{"grpcurl", "curl"} {
		if strings.Contains(b.text, tool+" ") {
			dir := filepath.Dir(tooltest.Path(t, tool))
			env = append(env, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", p.rewrite(b.text))
	cmd.Dir = ".."
	cmd.Env = p.env(append([]string{"REPORT_TOKEN=docs-token"}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// What the block starts in the background keeps the output open: Wait
	// returns a second after bash exits, and the group is then stopped.
	cmd.WaitDelay = time.Second
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // what the block left running
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // bash exited 0; its background jobs held the output
	}
	if err != nil {
		t.Fatalf("%v\n%s\noutput:\n%s", err, p.rewrite(b.text), out)
	}
}

// serveLines runs each line of the block (a command that starts the
// service), waits until it is healthy and stops it with SIGTERM.
func serveLines(t *testing.T, b shellBlock) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(b.text), "\n") {
		p := newPorts(t)
		if strings.Contains(b.args, "redis") {
			r := redistest.Start(t)
			p[6379] = r.Port
		}
		cmd := exec.Command("bash", "-c", p.rewrite(line))
		cmd.Dir = ".."
		cmd.Env = p.env()
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, p[8080], out)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			t.Fatalf("%s did not stop on SIGTERM\n%s", line, out)
		}
	}
}

// checkTestExists checks that a test function of that name exists.
func checkTestExists(t *testing.T, name string) {
	t.Helper()
	out, err := exec.Command("grep", "-rlE", "--include=*_test.go", `^func `+regexp.QuoteMeta(name)+`\(`, "..").Output()
	if err != nil || len(out) == 0 {
		t.Fatalf("no test %s", name)
	}
}

// checkStatic checks what a block that is not run names: its make targets,
// its go commands (as figure commands are checked), its -f files.
func checkStatic(t *testing.T, b shellBlock, makefile string) {
	t.Helper()
	text := strings.ReplaceAll(b.text, "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, cmd := range regexp.MustCompile(`;|&&|>|\(change\)`).Split(line, -1) {
			words := strings.Fields(cmd)
			switch {
			case len(words) == 0:
			case words[0] == "make" || words[0] == "go":
				checkCommand(t, b.where, strings.Join(words, " "), makefile)
			case words[0] == "kubectl" || words[0] == "docker":
				for i, w := range words {
					if w == "-f" && i+1 < len(words) {
						if _, err := os.Stat(filepath.Join("..", words[i+1])); err != nil {
							t.Errorf("%s names %s, which does not exist", b.where, words[i+1])
						}
					}
				}
				if words[0] == "docker" {
					if _, err := os.Stat("../docker-compose.yml"); err != nil {
						t.Errorf("%s: no docker-compose.yml", b.where)
					}
				}
			}
		}
	}
}

// writeFile writes content to path, creating its directory.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
