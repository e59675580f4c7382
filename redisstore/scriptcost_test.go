package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// BenchmarkScriptCost measures what the allow script costs Redis itself
// (INFO commandstats, microseconds of Redis CPU per call), for one group of
// one counter and for 20 groups in one call, as the pipeliner merges them:
// the script's set-up (defining its functions, once per call) against the
// work per counter.
//
//	go test -run '^$' -bench BenchmarkScriptCost -benchtime 20000x ./redisstore/
func BenchmarkScriptCost(b *testing.B) {
	r := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	ctx := context.Background()
	sp := mustSpec(b, time.Minute, 1)
	req := window.Request{Spec: sp, Limit: 1_000_000_000, Hits: 1, Veto: true}
	for _, groups := range []int{1, 20} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			c.ConfigResetStat(ctx)
			b.ResetTimer()
			for i := range b.N {
				keys := make([]string, groups)
				args := []any{""}
				for g := range groups {
					keys[g] = "cost" + strconv.Itoa((i*groups+g)%1000)
					args = append(args, 1, "0", packArgs(nil, &req))
				}
				if err := allowScript.Run(ctx, c, keys, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			perCall := evalshaMicros(b, c)
			b.ReportMetric(perCall, "redis-µs/call")
			b.ReportMetric(perCall/float64(groups), "redis-µs/counter")
		})
	}
}

// evalshaMicros reads EVALSHA's usec_per_call from INFO commandstats.
func evalshaMicros(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
			if k, v, _ := strings.Cut(kv, "="); k == "usec_per_call" {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	b.Fatal("no cmdstat_evalsha in INFO commandstats")
	return 0
}
