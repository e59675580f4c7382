package rlqssim

import (
	"errors"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs"
	"github.com/leapgate/leapgate/rlqs/quota"
)

// Spread is a Transport over several others, each a replica of the
// server: streams open on them in turn, as a load balancer spreads Envoys'
// connections (a filter that reopens its stream lands on the next one),
// and Tick and Restart go to every one.
type Spread struct {
	transports []Transport
	next       int
}

// NewSpread returns a Spread over ts (at least one).
func NewSpread(ts ...Transport) *Spread { return &Spread{transports: ts} }

// Open opens a stream on the next transport in turn.
func (t *Spread) Open(receive func(*rlqspb.RateLimitQuotaResponse)) (Conn, error) {
	tr := t.transports[t.next%len(t.transports)]
	t.next++
	return tr.Open(receive)
}

// Tick ticks every transport, in turn.
func (t *Spread) Tick(now time.Duration) {
	for _, tr := range t.transports {
		tr.Tick(now)
	}
}

// Restart restarts every transport.
func (t *Spread) Restart(now time.Duration) {
	for _, tr := range t.transports {
		tr.Restart(now)
	}
}

// Replicas is a Transport to several rlqs.Server values in this process,
// each with its own Ledger (package redisstore's QuotaLedger on one Redis,
// say), on one virtual clock, spread as Spread does.
//
// A ledger that times its claims by its own clock (Redis's) sees the
// virtual minutes pass in real seconds: claims are renewed every virtual
// tick, so the division is right, but a claim left behind would be held
// for its Hold in real time. Restart therefore restarts every replica with
// the ledger it had, as one fleet of replicas restarting.
type Replicas struct {
	*Spread
	replicas []*InProcess
}

// NewReplicas returns a transport to one new rlqs.Server per ledger, each
// with opts (its Clock replaced by the simulation's, its Ledger by the
// replica's) serving rules.
func NewReplicas(rules *descriptors.Set, opts rlqs.Options, ledgers []quota.Ledger) (*Replicas, error) {
	if len(ledgers) == 0 {
		return nil, errors.New("rlqssim: no replicas")
	}
	t := &Replicas{Spread: &Spread{}}
	for _, l := range ledgers {
		o := opts
		o.Ledger = l
		r, err := NewInProcess(rules, o)
		if err != nil {
			return nil, err
		}
		t.replicas = append(t.replicas, r)
		t.transports = append(t.transports, r)
	}
	return t, nil
}

// Servers returns the replicas' servers in use.
func (t *Replicas) Servers() []*rlqs.Server {
	out := make([]*rlqs.Server, len(t.replicas))
	for i, r := range t.replicas {
		out[i] = r.Server()
	}
	return out
}
