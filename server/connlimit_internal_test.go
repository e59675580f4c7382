package server

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLimitListenerEvicts: at the cap, Accept closes the idle connection
// first, else the oldest one still reading its request for evictAfter or
// longer, and never one that serves; with no such connection it waits.
func TestLimitListenerEvicts(t *testing.T) {
	type conn struct {
		phase connPhase
		age   time.Duration
	}
	for _, tt := range []struct {
		name   string
		conns  []conn
		victim int // index of the connection closed; -1: none (Accept waits)
	}{
		{"idle before reading", []conn{{phaseReading, time.Hour}, {phaseIdle, 0}}, 1},
		{"the longest idle", []conn{{phaseIdle, time.Second}, {phaseIdle, time.Minute}}, 1},
		{"the oldest reading", []conn{{phaseReading, 2 * evictAfter}, {phaseReading, 3 * evictAfter}}, 1},
		{"reading, not yet evictable", []conn{{phaseReading, evictAfter / 2}, {phaseServing, time.Hour}}, -1},
		{"serving never", []conn{{phaseServing, time.Hour}, {phaseServing, time.Hour}}, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1e9, 0)
			l := newLimitListener(ln, len(tt.conns), prometheus.NewCounter(prometheus.CounterOpts{Name: "l"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "e"}))
			l.now = func() time.Time { return now }
			defer l.Close()
			var server []*limitedConn
			for range tt.conns {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				s, err := l.Accept()
				if err != nil {
					t.Fatal(err)
				}
				server = append(server, s.(*limitedConn))
			}
			for i, c := range tt.conns {
				server[i].phase, server[i].since = c.phase, now.Add(-c.age)
			}
			extra, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer extra.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := l.Accept(); err == nil {
					accepted <- c
				}
			}()
			select {
			case c := <-accepted:
				defer c.Close()
				if tt.victim < 0 {
					t.Fatal("accepted at the cap with no connection to evict")
				}
				l.mu.Lock()
				_, open := l.conns[server[tt.victim]]
				l.mu.Unlock()
				if open {
					t.Fatalf("connection %d was not the one evicted", tt.victim)
				}
			case <-time.After(300 * time.Millisecond):
				if tt.victim >= 0 {
					t.Fatal("Accept waited with an evictable connection")
				}
			}
		})
	}
}
