// Package redistest runs real redis-server processes on free loopback ports
// for tests: the Redis backend's, the server's end-to-end tests and the
// soak. A test that needs Redis is skipped, with how to install it, when
// redis-server is not on PATH.
package redistest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	// conf is a sentinel's configuration file (StartSentinel); tls says
	// the port speaks TLS only (StartTLS), so readiness is a connection
	// accepted rather than a PING answered.
	conf string
	tls  bool
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

// StartSentinel starts redis-server in sentinel mode on a free loopback
// port, its configuration file made of the port, the address, the data
// directory and lines (for example "sentinel monitor mymaster 127.0.0.1
// 6379 1", "requirepass pw"), and waits until it answers. It is killed
// when the test ends.
func StartSentinel(t testing.TB, lines ...string) *Server {
	t.Helper()
	Need(t)
	s := &Server{t: t, Port: FreePort(t), Dir: t.TempDir()}
	s.conf = filepath.Join(s.Dir, "sentinel.conf")
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n%s\n", s.Port, s.Dir, strings.Join(lines, "\n"))
	if err := os.WriteFile(s.conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// StartTLS starts redis-server serving TLS only on a free loopback port,
// with the given certificate, key and CA files (clients must then present
// a certificate the CA signed) and args, and waits until the port accepts
// connections. It is killed when the test ends.
func StartTLS(t testing.TB, certFile, keyFile, caFile string, args ...string) *Server {
	t.Helper()
	Need(t)
	s := &Server{t: t, Port: FreePort(t), Dir: t.TempDir(), tls: true,
		args: append([]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile}, args...)}
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
	var args []string
	switch {
	case s.conf != "":
		args = []string{s.conf, "--sentinel"}
	case s.tls:
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
	default:
		args = []string{"--port", strconv.Itoa(s.Port)}
	}
	if s.conf == "" {
		args = append(args, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.Dir)
	}
	s.cmd = exec.Command("redis-server", append(args, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	ready := func() bool { return answers(s.Addr(), s.cmd.Process.Pid) }
	if s.tls {
		ready = func() bool { return accepts(s.Addr()) }
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ready() {
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

// Pause stops the process with SIGSTOP: it keeps its data and its
// connections but answers nothing (a stall, not a crash) until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused process run again (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatal("redistest: the server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: %v: %v", sig, err)
	}
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

// accepts reports whether something accepts connections on addr.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
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
