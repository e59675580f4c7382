package server

import (
	"reflect"
	"testing"
	"time"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/redisstore"
)

// TestRedisOptions: every REDIS_TYPE's URL, REDIS_AUTH's forms and every
// failure mode map to redisstore's typed options; invalid settings are
// refused with the variable's name.
func TestRedisOptions(t *testing.T) {
	base := config.Defaults().Redis
	for _, tc := range []struct {
		name   string
		change func(*config.Redis)
		want   redisstore.Options
	}{
		{"defaults", func(*config.Redis) {}, redisstore.Options{Network: "tcp", Addrs: []string{"localhost:6379"},
			PoolSize: 10, Timeout: 100 * time.Millisecond, Reservation: 2 * time.Second}},
		{"sentinel, auth, key prefix, local cache, local mode", func(r *config.Redis) {
			r.Type, r.URL, r.Auth, r.SentinelAuth = config.RedisSentinel, "mymaster, s1:26379 ,s2:26379", "pw", "admin:spw"
			r.CacheKeyPrefix, r.LocalCacheSizeInBytes, r.FailureMode = "lg_", 4096, config.RedisFailLocal
		}, redisstore.Options{Topology: redisstore.Sentinel, Network: "tcp", MasterName: "mymaster",
			Addrs: []string{"s1:26379", "s2:26379"}, Password: "pw", SentinelUsername: "admin", SentinelPassword: "spw",
			PoolSize: 10, Timeout: 100 * time.Millisecond, KeyPrefix: "lg_", LocalCacheBytes: 4096, FailureMode: redisstore.FailLocal,
			Reservation: 2 * time.Second}},
		{"cluster, ACL user, deny", func(r *config.Redis) {
			r.Type, r.URL, r.Auth, r.FailureMode = config.RedisCluster, "a:1,b:2,,c:3", "user:pw", config.RedisFailDeny
		}, redisstore.Options{Topology: redisstore.Cluster, Network: "tcp", Addrs: []string{"a:1", "b:2", "c:3"},
			Username: "user", Password: "pw", PoolSize: 10, Timeout: 100 * time.Millisecond, FailureMode: redisstore.FailDeny,
			Reservation: 2 * time.Second}},
		{"unix socket, allow, no reservations", func(r *config.Redis) {
			r.SocketType, r.URL, r.FailureMode, r.Reservation = "unix", "/run/redis.sock", config.RedisFailAllow, 0
		}, redisstore.Options{Network: "unix", Addrs: []string{"/run/redis.sock"}, PoolSize: 10,
			Timeout: 100 * time.Millisecond, FailureMode: redisstore.FailAllow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.change(&r)
			got, err := redisOptions(r)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	bad := base
	bad.FailureMode = "open"
	if _, err := redisOptions(bad); err == nil {
		t.Fatal("REDIS_FAILURE_MODE=open: no error")
	}
}
