package rlqssim

import (
	"context"
	"testing"
	"time"

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
// other replica's tick that would raise with it. The restart scenario is left out: the ledger times its
// claims by Redis's real clock, which a virtual minute does not move.
func TestScenariosOnTwoReplicas(t *testing.T) {
	r := redistest.Start(t)
	set, err := RuleSet()
	if err != nil {
		t.Fatal(err)
	}
	opts := rlqs.Options{Tick: 500 * time.Millisecond, AssignmentTTL: 4 * time.Second}
	for _, report := range []time.Duration{time.Second, 5 * time.Second} {
		for _, sc := range Scenarios(report) {
			if len(sc.Restarts) > 0 {
				continue
			}
			t.Run(sc.Name, func(t *testing.T) {
				store, err := redisstore.New(context.Background(), redisstore.Options{
					Addrs: []string{r.Addr()}, Timeout: 2 * time.Second, KeyPrefix: t.Name() + ":"})
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				tr, err := NewReplicas(set, opts, []quota.Ledger{store.QuotaLedger(), store.QuotaLedger()})
				if err != nil {
					t.Fatal(err)
				}
				checkTargets(t, sc, Run(sc, tr), opts, report, 3)
			})
		}
	}
}
