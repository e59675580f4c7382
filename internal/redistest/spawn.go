package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"time"
)

// Spawn starts a throw-away redis-server for a tool run outside tests
// (cmd/loadtest, cmd/rlqs-sim): on a free loopback port, without
// persistence, killed when ctx ends. It waits until the server answers and
// returns the process and its host:port; the caller kills and waits for
// the process when done.
func Spawn(ctx context.Context) (*exec.Cmd, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting redis-server (install it with apt-get install redis-server): %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); !answers(addr, cmd.Process.Pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, "", errors.New("redis-server on " + addr + " did not answer within 10s")
		}
	}
	return cmd, addr, nil
}
