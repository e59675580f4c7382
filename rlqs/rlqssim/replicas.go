package rlqssim

import (
	"errors"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs"
)

// Replicas is a Transport to several rlqs.Server values in this process,
// each with its own Ledger (package redisstore's QuotaLedger on one Redis,
// say), on one virtual clock. Streams open on the replicas in turn, as a
// load balancer spreads Envoys' connections: a filter that reopens its
// stream lands on the next replica.
//
// A ledger that times its claims by its own clock (Redis's) sees the
// virtual minutes pass in real seconds: claims are renewed every virtual
// tick, so the division is right, but a claim left behind would be held
// for its Hold in real time. Restart therefore restarts every replica with
// the ledger it had, as one fleet of replicas restarting.
type Replicas struct {
	replicas []*InProcess
	next     int
}

// NewReplicas returns a transport to one new rlqs.Server per ledger, each
// with opts (its Clock replaced by the simulation's, its Ledger by the
// replica's) serving rules.
func NewReplicas(rules *descriptors.Set, opts rlqs.Options, ledgers []rlqs.Ledger) (*Replicas, error) {
	if len(ledgers) == 0 {
		return nil, errors.New("rlqssim: no replicas")
	}
	t := &Replicas{}
	for _, l := range ledgers {
		o := opts
		o.Ledger = l
		r, err := NewInProcess(rules, o)
		if err != nil {
			return nil, err
		}
		t.replicas = append(t.replicas, r)
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

// Open opens a stream on the next replica in turn.
func (t *Replicas) Open(receive func(*rlqspb.RateLimitQuotaResponse)) (Conn, error) {
	r := t.replicas[t.next%len(t.replicas)]
	t.next++
	return r.Open(receive)
}

// Tick moves every replica's clock to now and runs the ticks due, the
// replicas in turn.
func (t *Replicas) Tick(now time.Duration) {
	for _, r := range t.replicas {
		r.Tick(now)
	}
}

// Restart restarts every replica: their streams are lost.
func (t *Replicas) Restart(now time.Duration) {
	for _, r := range t.replicas {
		r.Restart(now)
	}
}
