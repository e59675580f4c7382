// Package rlqssim simulates a fleet of Envoy rate_limit_quota filters
// against an RLQS server and scores what the fleet admits: the peak in any
// window of the rule's length against the limit, the share of the limit
// used, how fast the fleet follows a change, its fairness against max-min
// shares, and protocol errors. Each simulated filter behaves as Envoy's
// does (docs/rlqs.md): one stream, reports on one timer with time_elapsed
// in whole seconds, an immediate 0 s report for a new bucket, token
// buckets that start full and are replaced only when their max_tokens,
// tokens_per_fill or the nanos of fill_interval change, fallbacks on no
// assignment and on expiry, and a stream reopened on its next report after
// it is lost. Time is virtual: a Scenario of minutes runs in a second.
package rlqssim

import (
	"fmt"
	"math"
	"slices"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Step is the simulation's resolution: requests, deliveries and token
// buckets advance in steps of 1 ms.
const Step = time.Millisecond

// Conn is one stream to the server, as the transport opens it.
type Conn interface {
	// Report sends one usage report; an error means the stream is lost.
	Report(*rlqspb.RateLimitQuotaUsageReports) error
	// Close ends the stream.
	Close()
}

// Transport connects the simulated filters to the server under test.
type Transport interface {
	// Open opens a stream whose responses go to receive (called from the
	// transport's Tick or from Report, on the simulation's goroutine); an
	// error means the server cannot be reached.
	Open(receive func(*rlqspb.RateLimitQuotaResponse)) (Conn, error)
	// Tick advances the server to the virtual time now: it runs the
	// allocation ticks due.
	Tick(now time.Duration)
	// Restart loses the server's state and drops every stream.
	Restart(now time.Duration)
}

// Phase is a client's offered load from At on.
type Phase struct {
	At   time.Duration
	Rate float64 // requests per second, evenly spaced
}

// Client is one simulated Envoy with one bucket.
type Client struct {
	Name string
	// Bucket is the bucket id its requests build.
	Bucket map[string]string
	// Load is its offered load over time; before the first phase it
	// offers nothing.
	Load []Phase
	// Leave, when positive, closes its stream then (it offers nothing
	// after); Kill drops the stream without a close, and the filter
	// reopens it on its next report.
	Leave, Kill time.Duration
	// Report is its reporting interval; if 0, 5 s (what stock Envoy uses,
	// whatever reporting_interval says).
	Report time.Duration
	// NoAssignment and Expiry are its no_assignment_behavior and
	// expired_assignment_behavior.
	NoAssignment, Expiry Behavior
}

// offered is c's offered load at t.
func (c *Client) offered(t time.Duration) float64 {
	r := 0.0
	for _, p := range c.Load {
		if t >= p.At {
			r = p.Rate
		}
	}
	if c.Leave > 0 && t >= c.Leave {
		return 0
	}
	return r
}

// Scenario is one simulated run.
type Scenario struct {
	Name   string
	Domain string
	// Limit requests per Window is the rule every client's bucket falls
	// under (the scores are against it).
	Limit  float64
	Window time.Duration
	// Duration is how long the run lasts.
	Duration time.Duration
	Clients  []Client
	// Restarts are the times the server restarts.
	Restarts []time.Duration
	// Warmup is how long after the start, a join or a restart the peak is
	// not held to the 1.05 × limit bound (the first report interval); if
	// 0, the longest report interval.
	Warmup time.Duration
}

type delivery struct {
	f *filter
	m *rlqspb.RateLimitQuotaResponse
}

type sim struct {
	scenario  Scenario
	transport Transport
	filters   []*filter
	inbox     []delivery
	errors    []string
	// admitted[i][k] is what client i admitted in step k.
	admitted [][]uint16
}

func (s *sim) protocolError(e string) {
	if len(s.errors) < 20 {
		s.errors = append(s.errors, e)
	}
}

// protocolCheckReport is a hook for checks on the reports themselves
// (none: the simulated filter builds them as Envoy does).
func (s *sim) protocolCheckReport(*filter) {}

// Run runs the scenario against the transport and scores it.
func Run(sc Scenario, tr Transport) Result {
	s := &sim{scenario: sc, transport: tr}
	steps := int(sc.Duration / Step)
	s.admitted = make([][]uint16, len(sc.Clients))
	acc := make([]float64, len(sc.Clients))
	for i := range sc.Clients {
		c := &sc.Clients[i]
		if c.Report == 0 {
			c.Report = 5 * time.Second
		}
		s.filters = append(s.filters, &filter{sim: s, client: c})
		s.admitted[i] = make([]uint16, steps)
	}
	restarts := slices.Clone(sc.Restarts)
	for k := 0; k < steps; k++ {
		now := time.Duration(k) * Step
		if len(restarts) > 0 && now >= restarts[0] {
			restarts = restarts[1:]
			tr.Restart(now)
			for _, f := range s.filters {
				if f.conn != nil {
					f.conn.Close() // a stream the restart did not drop must not linger
				}
				f.conn = nil
			}
		}
		tr.Tick(now)
		inbox := s.inbox
		s.inbox = nil
		for _, d := range inbox {
			d.f.apply(now, d.m)
		}
		for i, f := range s.filters {
			c := f.client
			if c.Leave > 0 && now >= c.Leave {
				if f.conn != nil {
					f.conn.Close()
					f.conn = nil
				}
				continue
			}
			if c.Kill > 0 && now >= c.Kill && now < c.Kill+Step && f.conn != nil {
				// The connection drops: the server sees the stream end, the
				// filter runs on its assignment and reopens on its next report.
				f.conn.Close()
				f.conn = nil
			}
			acc[i] += c.offered(now) * Step.Seconds()
			for acc[i] >= 1 {
				acc[i]--
				if f.admit(now) {
					s.admitted[i][k]++
				}
			}
			if !f.timer && f.bucket != nil {
				f.timer, f.lastReport = true, now
			}
			if f.bucket != nil && now-f.lastReport >= c.Report {
				f.report(now, now-f.lastReport)
				f.lastReport = now
			}
		}
	}
	for _, f := range s.filters {
		if f.conn != nil {
			f.conn.Close()
		}
	}
	return s.score()
}

// Result is a run's scores.
type Result struct {
	Scenario string
	// Peak is the most admitted in any window of the rule's length, over
	// the limit; PeakSettled the same for windows that start a warm-up
	// after the start, every join and every restart.
	Peak, PeakSettled float64
	// Used is what the fleet admitted over what it could have (the lesser
	// of its offered load and the limit), over the settled windows.
	Used float64
	// Rates are each client's admitted rate in the last window of the run
	// (requests per second), and Targets its max-min fair share of the
	// limit by offered load then.
	Rates, Targets []float64
	// UsedLast is what the fleet admitted in the last window of the run
	// over what it could have (the lesser of its offered load and the
	// limit): the share of the limit used in steady state.
	UsedLast float64
	// FairnessError is the sum over clients of |rate − target|, over the
	// limit's rate, in the last window of the run.
	FairnessError float64
	// Converged is, per change of load, join or leave, how long after it
	// the fleet stayed within 5 % of the limit of the new targets (in L1
	// distance) until the next change; -1 when it never did.
	Converged []time.Duration
	// Errors are the protocol errors the filters saw.
	Errors []string
}

func (r Result) String() string {
	return fmt.Sprintf("%s: peak %.3f× (settled %.3f×), used %.1f %% (steady %.1f %%), fairness error %.1f %%, converged %v, rates %.0f, targets %.0f, %d protocol errors",
		r.Scenario, r.Peak, r.PeakSettled, 100*r.Used, 100*r.UsedLast, 100*r.FairnessError, r.Converged, r.Rates, r.Targets, len(r.Errors))
}

// fairShares returns the max-min fair shares of rate among offered.
func fairShares(rate float64, offered []float64) []float64 {
	n := len(offered)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return int(math.Copysign(1, offered[a]-offered[b])) })
	out := make([]float64, n)
	left := rate
	for k, i := range idx {
		out[i] = math.Min(offered[i], left/float64(n-k))
		left -= out[i]
	}
	return out
}
