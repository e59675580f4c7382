package server

import (
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener holds at most cap(sem) connections open at once: Accept
// waits for one to close first, leaving further clients in the kernel's
// accept queue, so that slow clients cannot take every file descriptor
// of the process.
type limitListener struct {
	net.Listener
	sem     chan struct{}
	limited prometheus.Counter
	done    chan struct{}
	once    sync.Once
}

// limitConns wraps ln (nil stays nil: its bind failed) with the
// HTTP_MAX_CONNECTIONS bound, counting waits under the listener's name.
func (s *Server) limitConns(ln net.Listener, name string) net.Listener {
	if ln == nil {
		return nil
	}
	return &limitListener{
		Listener: ln,
		sem:      make(chan struct{}, s.settings.HTTPMaxConnections),
		limited:  s.metrics.connLimited.WithLabelValues(name),
		done:     make(chan struct{}),
	}
}

// Accept waits for a free slot, then accepts a connection that frees its
// slot when closed.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.limited.Inc()
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.sem }}, nil
}

// Close closes the listener and ends a wait in Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn frees its listener slot on the first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
