package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// evictAfter is how long a connection may sit before it may be evicted at
// the cap while it has not sent a whole request (HTTP: its headers; gRPC:
// its first HTTP/2 HEADERS frame, or under TLS its first byte). A client that is not trickling sends that within
// milliseconds.
const evictAfter = time.Second

// connPhase is where a tracked connection is in its life.
type connPhase uint8

const (
	// phaseReading: accepted, or between requests and reading the next
	// one's first bytes or headers. Evictable once evictAfter old.
	phaseReading connPhase = iota
	// phaseServing: a request is being handled (HTTP), or the connection
	// has started a call (gRPC: its streams are the server's to bound).
	phaseServing
	// phaseIdle: an HTTP keep-alive connection between requests.
	// Evictable at once.
	phaseIdle
)

// limitListener holds at most cap(sem) connections open at once. At the
// cap, Accept first evicts a connection that is not doing useful work (an
// idle keep-alive connection, the longest idle first, or one that has not
// sent a whole request within evictAfter, the oldest first), so that idle
// or trickling clients cannot take every slot from a health probe; only if
// none can go does Accept wait, leaving further clients in the kernel's
// accept queue. Every connection counts against the process's file
// descriptors, which the cap keeps clear of.
type limitListener struct {
	net.Listener
	sem     chan struct{}
	limited prometheus.Counter
	evicted prometheus.Counter
	// firstByteServes: a connection's first byte moves it to serving (gRPC
	// under TLS, whose bytes the listener cannot read).
	firstByteServes bool
	// now is the clock of the phases (time.Now).
	now  func() time.Time
	done chan struct{}
	once sync.Once

	mu    sync.Mutex
	conns map[*limitedConn]struct{}
	// sniffH2: a plaintext gRPC listener, whose connections serve from
	// their first HEADERS frame (h2Sniffer).
	sniffH2 bool
}

// newLimitListener wraps ln (nil stays nil: its bind failed) with a cap of
// max connections, counting waits and evictions under the listener's name.
func newLimitListener(ln net.Listener, max int, limited, evicted prometheus.Counter) *limitListener {
	if ln == nil {
		return nil
	}
	return &limitListener{
		Listener: ln,
		sem:      make(chan struct{}, max),
		limited:  limited,
		evicted:  evicted,
		now:      time.Now,
		done:     make(chan struct{}),
		conns:    make(map[*limitedConn]struct{}),
	}
}

// limitConns wraps an HTTP listener with the HTTP_MAX_CONNECTIONS bound.
func (s *Server) limitConns(ln net.Listener, name string) net.Listener {
	l := newLimitListener(ln, s.settings.HTTPMaxConnections, s.metrics.connLimited.WithLabelValues(name), s.metrics.connEvicted.WithLabelValues(name))
	if l == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return l
}

// limitGRPCConns wraps the gRPC listener with the GRPC_MAX_CONNECTIONS
// bound (grpcMaxConnections). A plaintext connection serves from its first
// call or stream (its first HTTP/2 HEADERS frame), so one that sent only
// the preface is evicted at the cap like a silent one; under TLS, whose
// bytes the listener cannot read, from its first byte
// (GRPC_CONNECTION_TIMEOUT bounds the handshake, GRPC_MAX_CONNECTION_IDLE
// the silence after it).
func (s *Server) limitGRPCConns(ln net.Listener) net.Listener {
	l := newLimitListener(ln, grpcMaxConnections(s.settings.GRPCMaxConnections), s.metrics.grpcConnLimited, s.metrics.connEvicted.WithLabelValues("grpc"))
	if l == nil {
		return nil
	}
	if s.settings.GRPCServerUseTLS {
		l.firstByteServes = true
	} else {
		l.sniffH2 = true
	}
	return l
}

// Accept takes a free slot, evicting a connection that can go if there is
// none, else waiting for one; then it accepts a connection that frees its
// slot when closed.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.limited.Inc()
		if err := l.wait(); err != nil {
			return nil, err
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l, since: l.now()}
	if l.sniffH2 {
		lc.sniff = newH2Sniffer()
	}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// wait takes a slot of a full listener: it evicts a connection that can
// go, and, while none can, waits for a slot, trying again every
// evictPoll (a connection still reading turns evictable with age).
func (l *limitListener) wait() error {
	tick := time.NewTicker(evictPoll)
	defer tick.Stop()
	for {
		if l.evict() {
			l.evicted.Inc()
		}
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-l.done:
			return net.ErrClosed
		case <-tick.C:
		}
	}
}

// evictPoll is how often a full listener looks again for a connection to
// evict while it waits.
const evictPoll = 50 * time.Millisecond

// evict closes the connection that can best go, if any: the longest idle,
// else the oldest still reading its request for evictAfter or longer.
func (l *limitListener) evict() bool {
	now := l.now()
	l.mu.Lock()
	var victim *limitedConn
	better := func(c *limitedConn) bool {
		switch {
		case victim == nil:
			return true
		case c.phase != victim.phase:
			return c.phase == phaseIdle
		}
		return c.since.Before(victim.since)
	}
	for c := range l.conns {
		if c.phase == phaseIdle || (c.phase == phaseReading && now.Sub(c.since) >= evictAfter) {
			if better(c) {
				victim = c
			}
		}
	}
	l.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.Close()
	return true
}

// set records c's phase, from now.
func (l *limitListener) set(c *limitedConn, p connPhase) {
	l.mu.Lock()
	if _, ok := l.conns[c]; ok && c.phase != p {
		c.phase, c.since = p, l.now()
	}
	l.mu.Unlock()
}

// connState is an http.Server's ConnState hook: a connection between
// requests is idle; one that starts reading a request is reading until its
// handler runs (serving marks it).
func connState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		lc.l.set(lc, phaseIdle)
	case http.StateActive:
		lc.l.set(lc, phaseReading)
	}
}

// connContext is an http.Server's ConnContext hook: it puts the connection
// in the context of its requests, for serving.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, limitedConnKey{}, lc)
	}
	return ctx
}

type limitedConnKey struct{}

// serving wraps h so that a connection whose request reached its handler
// (its headers are in) is not evicted while the handler runs.
func serving(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lc, ok := r.Context().Value(limitedConnKey{}).(*limitedConn); ok {
			lc.l.set(lc, phaseServing)
		}
		h.ServeHTTP(w, r)
	})
}

// Close closes the listener and ends a wait in Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn frees its listener slot on the first Close. On the gRPC
// listener its reads move it from reading to serving: at its first HTTP/2
// HEADERS frame (plaintext), or its first byte (TLS).
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
	// phase and since (when it began) are guarded by l.mu.
	phase connPhase
	since time.Time
	// read is set after the first successful Read, and sniff (for a
	// plaintext gRPC connection) watches the bytes until the first call;
	// only Read touches them.
	read  bool
	sniff *h2Sniffer
}

func (c *limitedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.read {
		switch {
		case c.sniff != nil:
			if c.sniff.feed(b[:n]) {
				c.read, c.sniff = true, nil
				c.l.set(c, phaseServing)
			}
		case c.l.firstByteServes:
			c.read = true
			c.l.set(c, phaseServing)
		default:
			c.read = true
		}
	}
	return n, err
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}

// grpcMaxConnections is the gRPC listener's cap: n, or, for 0 (the
// default), half the process's file-descriptor limit, between 64 and
// 65536, so that connections alone cannot exhaust the descriptors the
// HTTP listeners (and health probes) and Redis need.
func grpcMaxConnections(n int) int {
	if n > 0 {
		return n
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		lim.Cur = 0
	}
	return connCapForFDs(lim.Cur)
}

// connCapForFDs is the default cap for a file-descriptor limit of fds:
// half of it, between 64 and 65536; 1024 when it is unknown (0).
func connCapForFDs(fds uint64) int {
	if fds == 0 {
		return 1024
	}
	return int(min(max(fds/2, 64), 65536))
}
