package redisstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/window"
)

// TestSentinel: REDIS_TYPE=sentinel finds the master through a real
// sentinel (password-protected, REDIS_SENTINEL_AUTH) and counts there.
func TestSentinel(t *testing.T) {
	master := startRedis(t)
	port := freePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nrequirepass spw\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.port)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	st := settingsFor(fmt.Sprintf("mymaster,127.0.0.1:%d", port))
	st.Type = config.RedisSentinel
	st.SentinelAuth = "spw"
	s := newTestStore(t, st, Options{})
	waitHealthy(t, s)
	sp := mustSpec(t, time.Minute, 6)
	ctx := context.Background()
	for i := range 4 {
		res, err := s.Do(ctx, []window.Request{{Key: "sentinel", Spec: sp, Limit: 3, Hits: 1, Veto: true}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i < 3) {
			t.Fatalf("hit %d: %+v", i, res[0])
		}
	}
	// The hits are on the master.
	direct := newTestStore(t, settingsFor(master.addr()), Options{})
	res, err := direct.Do(ctx, []window.Request{{Key: "sentinel", Spec: sp, Limit: 3, Hits: 0}})
	if err != nil || res[0].Allowed || res[0].Remaining != 0 {
		t.Fatalf("master's view: %+v %v", res, err)
	}
}
