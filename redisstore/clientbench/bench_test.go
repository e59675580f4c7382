// Package clientbench measures the Redis clients Leapgate could use, on
// its own admission script and a real redis-server, under many concurrent
// callers: the go-redis client behind redisstore's merging pipeliner (what
// Leapgate uses; FCALL on this Redis 7), the same client with one EVALSHA per call and a
// connection pool, and rueidis with its automatic pipelining (one EVALSHA
// per call, pipelined by the client), each with the script as EVALSHA and
// as a function (FCALL). Besides ns/op and allocations, each
// reports the client's CPU and Redis's CPU per call (getrusage and INFO
// cpu). It is a module of its own so that rueidis stays out of the
// service's module.
//
//	cd redisstore/clientbench && go test -run '^$' -bench . -benchmem -benchtime 200000x
package clientbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/window"
)

// callers is the concurrent callers of every case: the loadtest's 50.
const callers = 50

// keys is how many distinct counters the calls spread over.
const keys = 1000

// allowScript is the admission script as EVAL runs it, and allowLibrary
// the function library Redis 7 loads, registering allowFunction: its
// helpers are defined once, when it loads, rather than on every call. Both
// are redisstore's own (redisstore.Scripts).
var allowScript, allowLibrary, allowFunction = redisstore.Scripts()

// packed is one sliding-window counter's packed arguments (see redisstore/lua/batch.lua):
// 1s window, a limit far above the traffic, one hit.
func packed() string {
	var dst []byte
	for _, v := range []float64{1e6, 1, 1e9, 1} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v))
	}
	return string(append(dst, 1, 0, 0))
}

// cpu returns this process's CPU time.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns redis-server's CPU time from INFO cpu.
func redisCPU(t testing.TB, c *redis.Client) time.Duration {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				s, _ := strconv.ParseFloat(v, 64)
				total += s
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// measure runs call b.N times from callers goroutines and reports the
// client's and Redis's CPU per call.
func measure(b *testing.B, admin *redis.Client, call func(ctx context.Context, key string) error) {
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint("k", i)
	}
	b.SetParallelism((callers + 1) / 2) // RunParallel runs GOMAXPROCS × this
	ctx := context.Background()
	c0, r0 := cpu(), redisCPU(b, admin)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		for pb.Next() {
			if err := call(ctx, names[rng.IntN(keys)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpu()-c0).Microseconds())/float64(b.N), "client-cpu-µs/op")
	b.ReportMetric(float64((redisCPU(b, admin)-r0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
}

// BenchmarkClients is the side-by-side of the clients on one redis-server,
// one sliding-window admission per call.
func BenchmarkClients(b *testing.B) {
	r := redistest.Start(b)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	script := allowScript
	sha, err := admin.ScriptLoad(context.Background(), script).Result()
	if err != nil {
		b.Fatal(err)
	}
	args := packed()

	b.Run("go-redis/merging-pipeliner", func(b *testing.B) {
		s, err := redisstore.New(context.Background(), redisstore.Options{Addrs: []string{r.Addr()}, Registry: prometheus.NewRegistry(), HealthInterval: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		spec, _ := window.NewSpec(time.Second, 1)
		measure(b, admin, func(ctx context.Context, key string) error {
			_, err := s.Do(ctx, []window.Request{{Key: key, Spec: spec, Limit: 1e9, Hits: 1, Veto: true}})
			return err
		})
	})
	b.Run("go-redis/evalsha-per-call", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: callers})
		defer c.Close()
		measure(b, admin, func(ctx context.Context, key string) error {
			return c.EvalSha(ctx, sha, []string{"{" + key + "}:sw"}, "", 1, "0", args).Err()
		})
	})
	if err := admin.Do(context.Background(), "FUNCTION", "LOAD", "REPLACE", allowLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	b.Run("go-redis/fcall-per-call", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: callers})
		defer c.Close()
		measure(b, admin, func(ctx context.Context, key string) error {
			return c.FCall(ctx, allowFunction, []string{"{" + key + "}:sw"}, "", 1, "0", args).Err()
		})
	})
	b.Run("rueidis/auto-pipelining-fcall", func(b *testing.B) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		measure(b, admin, func(ctx context.Context, key string) error {
			return c.Do(ctx, c.B().Fcall().Function(allowFunction).Numkeys(1).Key("{"+key+"}:sw").Arg("", "1", "0", args).Build()).Error()
		})
	})
	b.Run("rueidis/auto-pipelining", func(b *testing.B) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		measure(b, admin, func(ctx context.Context, key string) error {
			return c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(1).Key("{"+key+"}:sw").Arg("", "1", "0", args).Build()).Error()
		})
	})
}
