// Package breaker implements circuit breakers fed by observed response times
// and statuses, and enforced through the rate-limit answer.
//
// A Breaker is closed while its upstream is healthy. It opens when its
// strategy's threshold is crossed with at least MinRequests observations in
// its sliding statistics window, refuses every request for OpenDuration,
// then half-opens: it admits at most HalfOpenProbes requests as probes. If
// every probe succeeds it closes with a fresh window; a failing probe, or one
// that reports nothing within ProbeTimeout, reopens it for a fresh
// OpenDuration, so a breaker never sticks in half-open.
//
// Which observation is a probe's result. Every probe gets an id
// (AllowProbeAt); the rate-limit service hands it to Envoy in the header
// envoyhdr.ProbeHeader of the request it admits, and an observation that carries the
// header back (Outcome.Probes: ext_proc and the access-log service read it,
// /report takes it in "headers") is the result of exactly that probe. An
// observation with ids of no outstanding probe (a probe of an earlier
// half-open period reporting late) only feeds the statistics.
//
// Observations that carry no id cannot be told from a straggler admitted
// before the breaker opened. Until a breaker has seen a tagged observation,
// it relies on this: while it is open or half-open, the enforcing proxy lets
// only admitted probes through, so the only new observations are probes; it
// takes an untagged observation as a probe result only while it has a probe
// outstanding, pairing results with probes first-in first-out. The residual
// ambiguity: a straggler reported while a probe is outstanding is taken as
// that probe's result; if it failed it reopens the breaker early (the safe
// direction); if it succeeded it stands in for the probe. Once a breaker
// has seen one tagged observation, the header comes back with its probes'
// outcomes, and its untagged observations are never taken for probes
// again. This is decided per breaker, not per feed: where some Envoys
// forward the header and others do not, a breaker that only the others
// feed still closes from its probes' untagged results. (A breaker fed by
// both kinds, once it has seen a tag, waits for the tagged results; a probe
// that went through an Envoy that drops the header is caught by
// ProbeTimeout.) A probe that never reports is caught by ProbeTimeout
// either way.
//
// Every method that depends on time has an ...At form taking the current
// time as a Duration since the origin of a window.Clock.
package breaker

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// State is the state of a breaker.
type State int32

// The states of a breaker. Their numeric values are the values of the
// state gauge.
const (
	Closed   State = 0
	Open     State = 1
	HalfOpen State = 2
)

// String returns the state's name: closed, open or half_open.
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// MarshalText encodes the state as its name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Transition describes one state change of a breaker.
type Transition struct {
	From, To State
	// At is the time of the change.
	At time.Duration
	// Reason says what caused it: "threshold", "open_duration elapsed",
	// "probe failed", "probe timeout", "probes succeeded".
	Reason string
	// Failed and Total are the window counts when the breaker opened from
	// closed.
	Failed, Total uint64
}

// Breaker is one circuit breaker. It is safe for concurrent use: Allow in
// the closed state is one atomic load; everything else takes a mutex.
type Breaker struct {
	cfg   Config
	state atomic.Int32 // State
	until atomic.Int64 // while Open: the time it half-opens
	// openFor is how long the breaker stayed open the last time it opened
	// (the backoff doubles it on each reopening from half-open); b.mu held.
	openFor time.Duration
	seen    atomic.Int64 // the time of the latest observation (for reclaiming idle breakers)

	onChange func(Transition) // called with mu held, once per transition

	mu        sync.Mutex
	stats     ring
	probes    []probe // outstanding probes, oldest first
	admitted  uint32  // probes admitted in this half-open period
	succeeded uint32  // probes that succeeded in this half-open period
	// tagged: an observation carrying probe ids has been seen, so untagged
	// observations are never probe results (see the package documentation).
	tagged bool

	// The ramp after closing from half-open (RampDuration): rampUntil is
	// its end, 0 when none is in progress, so that Allow in a steady closed
	// state costs one atomic load more; rampStart and rampCredit (see
	// rampAllow) are under mu.
	rampUntil  atomic.Int64
	rampStart  time.Duration
	rampCredit float64
}

// probe is an admitted probe not yet reported.
type probe struct {
	at time.Duration // admission time
	id uint64        // never 0
}

// New returns a closed breaker. onChange, if not nil, is called once for
// every state change, while the breaker's lock is held (it must not call
// back into the breaker).
func New(cfg Config, onChange func(Transition)) *Breaker {
	return &Breaker{
		cfg:      cfg,
		onChange: onChange,
		stats:    newRing(cfg.Spec),
		probes:   make([]probe, 0, cfg.HalfOpenProbes),
	}
}

// Config returns the breaker's configuration.
func (b *Breaker) Config() Config { return b.cfg }

// State returns the state as last changed; an open breaker whose
// OpenDuration has elapsed reads Open until the next call that takes the
// time (AllowAt, ObserveAt, AdvanceAt) moves it on.
func (b *Breaker) State() State { return State(b.state.Load()) }

// AllowAt reports whether a request may pass at now and, if not, how long
// until a retry surely can (if no probe reports in between): the time until
// it half-opens, or, while half-open with every probe slot taken, until the
// oldest probe times out plus OpenDuration (the breaker reopens then). In
// the half-open state an admitted request is a probe (see AllowProbeAt).
func (b *Breaker) AllowAt(now time.Duration) (ok bool, retryAfter time.Duration) {
	ok, _, retryAfter = b.AllowProbeAt(now)
	return ok, retryAfter
}

// AllowProbeAt is AllowAt that also returns, for a request admitted as a
// probe, the probe's id (0 otherwise): an observation carrying it in
// Outcome.Probes is that probe's result.
func (b *Breaker) AllowProbeAt(now time.Duration) (ok bool, id uint64, retryAfter time.Duration) {
	switch State(b.state.Load()) {
	case Closed:
		if b.rampUntil.Load() == 0 {
			return true, 0, 0
		}
	case Open:
		if until := time.Duration(b.until.Load()); now < until {
			return false, 0, until - now
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	switch State(b.state.Load()) {
	case Closed:
		return b.rampAllow(now)
	case Open:
		return false, 0, time.Duration(b.until.Load()) - now
	}
	if b.admitted < b.cfg.HalfOpenProbes {
		b.admitted++
		id := rand.Uint64() | 1 // never 0
		b.probes = append(b.probes, probe{at: now, id: id})
		return true, id, 0
	}
	// Every slot is taken and at least one probe is outstanding (all
	// reported would have closed or reopened the breaker). Unless the
	// probes report success first, the oldest one times out, the breaker
	// reopens then (for the backed-off period), and only after that can a
	// retry pass.
	return false, 0, max(b.probes[0].at+b.cfg.ProbeTimeout+b.reopenFor()-now, time.Nanosecond)
}

// ObserveAt records the outcome of one request observed at now and moves
// the breaker on: a closed breaker opens if its threshold is crossed; a
// half-open one with a probe outstanding takes the outcome as that probe's
// result.
func (b *Breaker) ObserveAt(now time.Duration, o Outcome) {
	b.seen.Store(int64(now))
	failed := b.cfg.Failed(o)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	b.stats.add(now, failed)
	switch State(b.state.Load()) {
	case Closed:
		if f, t := b.stats.sum(now); b.cfg.tripped(f, t) {
			b.open(now, Closed, "threshold", f, t)
		}
	case HalfOpen:
		if !b.takeProbe(o) {
			return // not a probe's result: see the package documentation
		}
		if failed {
			b.open(now, HalfOpen, "probe failed", 0, 0)
			return
		}
		b.succeeded++
		if b.succeeded >= b.cfg.HalfOpenProbes {
			b.stats.reset()
			if b.cfg.RampDuration > 0 {
				b.rampStart, b.rampCredit = now, 0
				b.rampUntil.Store(int64(now + b.cfg.RampDuration))
			}
			b.set(now, HalfOpen, Closed, "probes succeeded", 0, 0)
		}
	}
}

// takeProbe removes the outstanding probe o reports, and reports whether
// there was one: the probe with one of o's ids, or, for an untagged outcome
// while this breaker has seen no tagged one, the oldest (see the package
// documentation). b.mu is held.
func (b *Breaker) takeProbe(o Outcome) bool {
	i := -1
	switch {
	case len(o.Probes) > 0:
		b.tagged = true
		i = slices.IndexFunc(b.probes, func(p probe) bool { return slices.Contains(o.Probes, p.id) })
	case !b.tagged && len(b.probes) > 0:
		i = 0
	}
	if i < 0 {
		return false
	}
	b.probes = slices.Delete(b.probes, i, i+1)
	return true
}

// AdvanceAt applies the transitions due by now without a request: open to
// half-open once OpenDuration has elapsed, half-open back to open when a
// probe has been outstanding for ProbeTimeout.
func (b *Breaker) AdvanceAt(now time.Duration) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return State(b.state.Load())
}

// advance applies every time-driven transition due by now, each at the
// instant it came due (not at now): open to half-open once OpenDuration has
// elapsed, half-open back to open when the oldest probe has been
// outstanding for ProbeTimeout, and so on, however long nothing asked.
// b.mu is held.
func (b *Breaker) advance(now time.Duration) {
	for {
		switch State(b.state.Load()) {
		case Open:
			until := time.Duration(b.until.Load())
			if now < until {
				return
			}
			b.admitted, b.succeeded = 0, 0
			b.probes = b.probes[:0]
			b.set(until, Open, HalfOpen, "open_duration elapsed", 0, 0)
		case HalfOpen:
			if len(b.probes) == 0 {
				return
			}
			due := b.probes[0].at + b.cfg.ProbeTimeout
			if now < due {
				return
			}
			b.open(due, HalfOpen, "probe timeout", 0, 0)
		default:
			return
		}
	}
}

// open moves the breaker to Open: for OpenDuration from closed, for the
// backed-off reopenFor from half-open; b.mu is held.
func (b *Breaker) open(now time.Duration, from State, reason string, failed, total uint64) {
	if from == HalfOpen {
		b.openFor = b.reopenFor()
	} else {
		b.openFor = b.cfg.OpenDuration
	}
	b.until.Store(int64(now + b.openFor))
	b.probes = b.probes[:0]
	b.rampUntil.Store(0)
	b.set(now, from, Open, reason, failed, total)
}

// rampAllow decides a request while closed: at a time d into a ramp it
// admits the share d/RampDuration of requests, by counts, not chance: each
// request adds the current share to a credit, and one passes when the
// credit reaches 1 (which it then spends). So the share holds for any
// traffic, bursts included. After the ramp, or with none, every request
// passes. A refused request's retry hint is the earliest time the next
// request passes if no other comes in between. b.mu is held.
func (b *Breaker) rampAllow(now time.Duration) (ok bool, id uint64, retryAfter time.Duration) {
	until := time.Duration(b.rampUntil.Load())
	if until == 0 || now >= until {
		b.rampUntil.Store(0)
		return true, 0, 0
	}
	ramp := float64(b.cfg.RampDuration)
	b.rampCredit += float64(now-b.rampStart) / ramp
	if b.rampCredit >= 1 {
		b.rampCredit--
		return true, 0, 0
	}
	// The next request passes once its share brings the credit to 1.
	at := b.rampStart + time.Duration(math.Ceil(ramp*(1-b.rampCredit)))
	return false, 0, max(min(at, until)-now, time.Nanosecond)
}

// abandoned reports whether b, open or half-open, has had no observation
// for longer than its longest open period plus ProbeTimeout. A breaker
// whose upstream still gets requests has one by then: the open period ends,
// the next request is a probe, and its outcome is observed. So an
// abandoned breaker belongs to a value nobody sends any more (or forged
// once): its slot may be reclaimed.
func (b *Breaker) abandoned(now time.Duration) bool {
	return now-time.Duration(b.seen.Load()) > max(b.cfg.MaxOpenDuration, b.cfg.OpenDuration)+b.cfg.ProbeTimeout
}

// Steady reports whether the breaker is closed with no ramp in progress:
// then every request passes, without reading the clock.
func (b *Breaker) Steady() bool {
	return State(b.state.Load()) == Closed && b.rampUntil.Load() == 0
}

// reopenFor is how long the breaker stays open if it reopens from
// half-open now: twice the last open period, within [OpenDuration,
// MaxOpenDuration]. b.mu is held.
func (b *Breaker) reopenFor() time.Duration {
	longest := max(b.cfg.MaxOpenDuration, b.cfg.OpenDuration)
	if b.openFor >= longest/2 {
		return longest
	}
	return max(2*b.openFor, b.cfg.OpenDuration)
}

func (b *Breaker) set(now time.Duration, from, to State, reason string, failed, total uint64) {
	b.state.Store(int32(to))
	if b.onChange != nil {
		b.onChange(Transition{From: from, To: to, At: now, Reason: reason, Failed: failed, Total: total})
	}
}

// Stats is a point-in-time view of a breaker.
type Stats struct {
	State State `json:"state"`
	// Failed and Total are the counts in the statistics window: slow (or
	// aborted) requests for slow_request_ratio, failed ones otherwise.
	Failed uint64 `json:"failed"`
	Total  uint64 `json:"total"`
	// RetryAfter is, while open, the time until the breaker half-opens.
	RetryAfter time.Duration `json:"-"`
	// ProbesAdmitted, ProbesOutstanding and ProbesSucceeded describe the
	// current half-open period.
	ProbesAdmitted    uint32 `json:"probes_admitted,omitempty"`
	ProbesOutstanding int    `json:"probes_outstanding,omitempty"`
	ProbesSucceeded   uint32 `json:"probes_succeeded,omitempty"`
	// RampShare is, while closed and ramping up (RampDuration), the share of
	// requests admitted now; 0 otherwise.
	RampShare float64 `json:"ramp_share,omitempty"`
}

// StatsAt returns the breaker's state and window counts at now, after
// applying the transitions due by then.
func (b *Breaker) StatsAt(now time.Duration) Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	s := Stats{State: State(b.state.Load())}
	s.Failed, s.Total = b.stats.sum(now)
	switch s.State {
	case Closed:
		if until := time.Duration(b.rampUntil.Load()); until > now {
			s.RampShare = float64(now-b.rampStart) / float64(b.cfg.RampDuration)
		}
	case Open:
		s.RetryAfter = time.Duration(b.until.Load()) - now
	case HalfOpen:
		s.ProbesAdmitted, s.ProbesOutstanding, s.ProbesSucceeded = b.admitted, len(b.probes), b.succeeded
	}
	return s
}
