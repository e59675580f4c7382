package server

import (
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
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
		{"reading for exactly evictAfter", []conn{{phaseReading, evictAfter}, {phaseServing, time.Hour}}, 0},
		{"reading, not yet evictable", []conn{{phaseReading, evictAfter / 2}, {phaseServing, time.Hour}}, -1},
		{"serving never", []conn{{phaseServing, time.Hour}, {phaseServing, time.Hour}}, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1e9, 0)
			l := testLimitListener(t, len(tt.conns), &now)
			var server []*limitedConn
			for range tt.conns {
				_, s := connect(t, l)
				server = append(server, s)
			}
			for i, c := range tt.conns {
				server[i].phase, server[i].since = c.phase, now.Add(-c.age)
			}
			extra, err := net.Dial("tcp", l.Addr().String())
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

// TestLimitedConnPhases: what moves a connection between reading, serving
// and idle, and from when its phase counts (a phase entered again keeps
// its start): the first bytes on a TLS gRPC listener, the first HEADERS
// frame on a plaintext one, never a read that returned nothing; on an
// HTTP listener the server's connection states and a handler that runs.
func TestLimitedConnPhases(t *testing.T) {
	preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	headers := []byte{0, 0, 0, 0x1, 0, 0, 0, 0, 1}
	type step struct {
		do    func(t *testing.T, lc *limitedConn, client net.Conn)
		phase connPhase
		since time.Duration // after the start
	}
	send := func(b []byte) func(*testing.T, *limitedConn, net.Conn) {
		return func(t *testing.T, lc *limitedConn, client net.Conn) {
			if _, err := client.Write(b); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, len(b))
			for got := 0; got < len(b); {
				n, err := lc.Read(buf[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		}
	}
	readNothing := func(t *testing.T, lc *limitedConn, _ net.Conn) {
		if err := lc.SetReadDeadline(time.Unix(1, 0)); err != nil {
			t.Fatal(err)
		}
		if n, err := lc.Read(make([]byte, 8)); n != 0 || err == nil {
			t.Fatalf("read past its deadline: %d bytes, %v", n, err)
		}
		if err := lc.SetReadDeadline(time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	state := func(st http.ConnState) func(*testing.T, *limitedConn, net.Conn) {
		return func(_ *testing.T, lc *limitedConn, _ net.Conn) { connState(lc, st) }
	}
	handled := func(_ *testing.T, lc *limitedConn, _ net.Conn) {
		var during connPhase
		h := serving(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			lc.l.mu.Lock()
			during = lc.phase
			lc.l.mu.Unlock()
		}))
		r := httptest.NewRequest("GET", "/", nil)
		h.ServeHTTP(httptest.NewRecorder(), r.WithContext(connContext(r.Context(), lc)))
		if during != phaseServing {
			t.Errorf("phase %d while the handler runs, want serving", during)
		}
	}
	for _, tt := range []struct {
		name  string
		setup func(l *limitListener)
		steps []step
	}{
		{"TLS gRPC: the first byte serves", func(l *limitListener) { l.firstByteServes = true }, []step{
			{readNothing, phaseReading, 0},
			{send([]byte{0x16}), phaseServing, 1},
			{send([]byte{0x17}), phaseServing, 1},
		}},
		{"plaintext gRPC: the first HEADERS frame serves", func(l *limitListener) { l.sniffH2 = true }, []step{
			{send(preface), phaseReading, 0},
			{readNothing, phaseReading, 0},
			{send(headers), phaseServing, 2},
		}},
		{"HTTP: bytes alone do not serve", func(*limitListener) {}, []step{
			{send([]byte("GET / HTTP/1.1\r\n")), phaseReading, 0},
			{state(http.StateIdle), phaseIdle, 1},
			{state(http.StateIdle), phaseIdle, 1},
			{state(http.StateActive), phaseReading, 3},
			{state(http.StateActive), phaseReading, 3},
			{handled, phaseServing, 5},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1e9, 0)
			now := start
			l := testLimitListener(t, 2, &now)
			tt.setup(l)
			client, lc := connect(t, l)
			for i, st := range tt.steps {
				now = start.Add(time.Duration(i) * time.Second)
				st.do(t, lc, client)
				l.mu.Lock()
				phase, since := lc.phase, lc.since.Sub(start)
				l.mu.Unlock()
				if phase != st.phase || since != st.since*time.Second {
					t.Errorf("step %d: phase %d since %v, want %d since %v", i, phase, since, st.phase, st.since*time.Second)
				}
			}
		})
	}
}

// TestGRPCMaxConnections: a cap set is kept; the default is half the
// process's file-descriptor limit, between 64 and 65536, and 1024 when
// the limit is unknown.
func TestGRPCMaxConnections(t *testing.T) {
	for _, tt := range []struct {
		fds  uint64
		want int
	}{
		{0, 1024}, {100, 64}, {128, 64}, {130, 65}, {2048, 1024}, {131070, 65535}, {131072, 65536}, {1 << 40, 65536},
	} {
		if got := connCapForFDs(tt.fds); got != tt.want {
			t.Errorf("connCapForFDs(%d) = %d, want %d", tt.fds, got, tt.want)
		}
	}
	if got := grpcMaxConnections(7); got != 7 {
		t.Errorf("grpcMaxConnections(7) = %d, want 7", got)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if got, want := grpcMaxConnections(0), connCapForFDs(lim.Cur); got != want {
		t.Errorf("grpcMaxConnections(0) = %d, want %d (soft limit %d)", got, want, lim.Cur)
	}
}

// testLimitListener is a limitListener of max connections on a loopback
// port, on the clock *now, closed when t ends.
func testLimitListener(t *testing.T, max int, now *time.Time) *limitListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(ln, max, prometheus.NewCounter(prometheus.CounterOpts{Name: "l"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "e"}))
	l.now = func() time.Time { return *now }
	t.Cleanup(func() { l.Close() })
	return l
}

// connect dials l and accepts the connection: the client's end and the
// listener's, both closed when t ends.
func connect(t *testing.T, l *limitListener) (net.Conn, *limitedConn) {
	t.Helper()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return client, c.(*limitedConn)
}
