package rlqssim

import (
	"context"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/rlqs"
)

// InProcess is a Transport to rlqs.Server values in this process, on a
// virtual clock: the simulation's time is the server's.
type InProcess struct {
	rules  *descriptors.Set
	opts   rlqs.Options
	clock  *testclock.Clock
	server *rlqs.Server
	conns  []*inProcessConn
	next   time.Duration // the next tick
}

// NewInProcess returns a transport to a new rlqs.Server with opts (its
// Clock replaced by the simulation's) serving rules.
func NewInProcess(rules *descriptors.Set, opts rlqs.Options) (*InProcess, error) {
	t := &InProcess{rules: rules, opts: opts, clock: testclock.At(0)}
	if t.opts.Tick == 0 {
		t.opts.Tick = 500 * time.Millisecond
	}
	if err := t.start(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *InProcess) start() error {
	o := t.opts
	o.Clock = t.clock
	s, err := rlqs.New(o)
	if err != nil {
		return err
	}
	s.SetRules(t.rules)
	t.server = s
	return nil
}

// Server returns the server in use (a new one after every Restart).
func (t *InProcess) Server() *rlqs.Server { return t.server }

// Open opens a stream on the current server.
func (t *InProcess) Open(receive func(*rlqspb.RateLimitQuotaResponse)) (Conn, error) {
	c := &inProcessConn{stream: t.server.Open(receive)}
	t.conns = append(t.conns, c)
	return c, nil
}

// Tick moves the server's clock to now and runs the ticks due.
func (t *InProcess) Tick(now time.Duration) {
	t.clock.Set(now)
	for now >= t.next {
		t.server.Tick(context.Background())
		t.next += t.opts.Tick
	}
}

// Restart replaces the server with a new one: its streams are lost.
func (t *InProcess) Restart(now time.Duration) {
	for _, c := range t.conns {
		c.lost = true
	}
	t.conns = nil
	t.clock.Set(now)
	if err := t.start(); err != nil {
		panic(err) // the options worked once
	}
	t.next = now
}

type inProcessConn struct {
	stream *rlqs.Stream
	lost   bool
}

func (c *inProcessConn) Report(m *rlqspb.RateLimitQuotaUsageReports) error {
	if c.lost {
		return errLost
	}
	c.stream.Report(m)
	return nil
}

func (c *inProcessConn) Close() {
	if !c.lost {
		c.stream.Close()
	}
}

type lostError struct{}

func (lostError) Error() string { return "the stream was lost with its server" }

var errLost error = lostError{}
