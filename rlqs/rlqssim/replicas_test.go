package rlqssim

import (
	"context"
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/rlqs"
	"github.com/leapgate/leapgate/rlqs/quota"
)

// TestScenariosOnTwoReplicas holds two replicas sharing one redis-server
// through redisstore.QuotaLedger to the same targets as one server, with
// the fleet's streams spread over both (a reopened stream lands on the
// other replica), but for one tick more to follow a change: a replica's
// cut is in the ledger from its next claim, which may come after the
// other replica's tick that would raise with it. The restart scenario is
// left out: the ledger times its claims by Redis's real clock, which a
// virtual minute does not move.
func TestScenariosOnTwoReplicas(t *testing.T) {
	r := redistest.Start(t)
	runScenarios(t, false, 3, func(t *testing.T, set *descriptors.Set, opts rlqs.Options) (Transport, error) {
		store, err := redisstore.New(context.Background(), redisstore.Options{
			Addrs: []string{r.Addr()}, Timeout: 2 * time.Second, KeyPrefix: t.Name() + ":"})
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { store.Close() })
		return NewReplicas(set, opts, []quota.Ledger{store.QuotaLedger(), store.QuotaLedger()})
	})
}
