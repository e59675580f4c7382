// Package redistest runs real redis-server processes on free loopback ports
// for tests: the Redis backend's, the server's end-to-end tests and the
// soak. A test that needs Redis is skipped, with how to install it, when
// redis-server is not on PATH.
package redistest

import (
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one redis-server child process. It keeps its port and data
// directory across Kill and Restart, so a test can crash it and bring it
// back where clients expect it.
type Server struct {
	t    testing.TB
	Port int
	// Dir is the server's working directory (AOF, cluster config).
	Dir  string
	args []string
	cmd  *exec.Cmd
}

// Need skips the test when redis-server is not installed.
func Need(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server redis-tools, or `make test` as root); skipping")
	}
}

// Start starts redis-server on a free loopback port, without persistence
// unless args say otherwise (later arguments override earlier ones), and
// waits until it answers. It is killed when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return StartOn(t, FreePort(t), args...)
}

// StartOn is Start on a given port (for a test that points a client at the
// port before the server exists).
func StartOn(t testing.TB, port int, args ...string) *Server {
	t.Helper()
	Need(t)
	s := &Server{t: t, Port: port, Dir: t.TempDir(), args: args}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// Restart starts the process again on the same port and directory and
// waits until this process (not another that took the port meanwhile)
// answers PING.
func (s *Server) Restart() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.Dir}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !answers(s.Addr(), s.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server (pid %d) on %s did not answer within 10s (port taken by another process?)", s.cmd.Process.Pid, s.Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill ends the process with SIGKILL (a crash, not a shutdown) and waits
// for it. Killing a stopped server does nothing.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct loopback ports that were free a moment ago.
// It holds every listener until all n are chosen, so the kernel cannot hand
// the same port out twice (as n calls of FreePort can).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// answers reports whether the Redis on addr is ready and is process pid: it
// answers PING with PONG (not LOADING) and INFO names pid. A server that
// requires a password answers NOAUTH, which counts as ready (its pid cannot
// be read without the password).
func answers(addr string, pid int) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\nINFO server\r\n"); err != nil {
		return false
	}
	var reply strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		reply.Write(buf[:n])
		text := reply.String()
		if strings.HasPrefix(text, "-NOAUTH") {
			return true
		}
		if i := strings.Index(text, "process_id:"); i >= 0 {
			rest := text[i+len("process_id:"):]
			if j := strings.Index(rest, "\r\n"); j >= 0 {
				got, _ := strconv.Atoi(rest[:j])
				return strings.HasPrefix(text, "+PONG") && got == pid
			}
		}
		if err != nil {
			return false
		}
	}
}
