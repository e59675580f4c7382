package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/rlqs/quota"
)

//go:embed quotaledger.lua
var quotaLedgerLua string

var quotaLedgerScript = redis.NewScript(quotaLedgerLua)

// QuotaLedger is the RLQS ledger on Redis (quota.Ledger): replicas that
// share a Redis share the division of every limit. Each limit is one hash
// (its own hash slot on a Cluster) with one field per replica; one script
// call per limit and tick, pipelined per node, records this replica's
// claim and returns the limit's division over every live claim, with the
// raise granted to this replica recorded at once. Redis's clock times the
// claims' expiry, so replicas' clocks do not matter. Redis work grows with
// limits × replicas per tick, not with requests.
type QuotaLedger struct {
	client  redis.UniversalClient
	prefix  string
	replica string
}

// QuotaLedger returns the Store's RLQS ledger, on its connections and key
// prefix, as one replica (a random id, new with every call).
func (s *Store) QuotaLedger() *QuotaLedger {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	return &QuotaLedger{client: s.client, prefix: s.prefix, replica: hex.EncodeToString(id)}
}

// quotaKey is the hash of a limit: the prefix, then "rlqs:" and the
// SHA-256 of the counter key as a hash tag (counter keys hold any bytes).
func (l *QuotaLedger) quotaKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return l.prefix + "rlqs:{" + hex.EncodeToString(sum[:16]) + "}"
}

// Divide implements quota.Ledger: one pipelined script call per claim.
func (l *QuotaLedger) Divide(ctx context.Context, claims []quota.Claim) ([]quota.Division, error) {
	out, err := l.divide(ctx, claims)
	if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
		if err := quotaLedgerScript.Load(ctx, l.client).Err(); err != nil {
			return nil, fmt.Errorf("loading the RLQS ledger script: %w", err)
		}
		out, err = l.divide(ctx, claims)
	}
	return out, err
}

func (l *QuotaLedger) divide(ctx context.Context, claims []quota.Claim) ([]quota.Division, error) {
	pipe := l.client.Pipeline()
	cmds := make([]*redis.Cmd, len(claims))
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	for i, c := range claims {
		args := []any{l.replica, c.Hold.Milliseconds(), f(c.Limit), f(c.Reserve), f(c.Fixed), f(c.Committed),
			f(math.Min(c.Want, c.Limit)), f(quota.MinBurst), f(quota.BurstShare)}
		for j := range c.Demands {
			args = append(args, f(math.Min(c.Demands[j], c.Limit)), f(c.Weights[j]))
		}
		cmds[i] = quotaLedgerScript.EvalSha(ctx, pipe, []string{l.quotaKey(c.Key)}, args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("RLQS ledger: %w", err)
	}
	out := make([]quota.Division, len(claims))
	for i, cmd := range cmds {
		vals, err := cmd.Slice()
		if err != nil || len(vals) != 4 {
			return nil, errors.Join(fmt.Errorf("RLQS ledger: unexpected answer %v", vals), err)
		}
		var d quota.Division
		var perr error
		parse := func(v any) float64 {
			s, _ := v.(string)
			if s == "inf" {
				return math.Inf(1)
			}
			x, err := strconv.ParseFloat(s, 64)
			perr = errors.Join(perr, err)
			return x
		}
		d.Level, d.Spare, d.Grant = parse(vals[0]), parse(vals[1]), parse(vals[2])
		n, _ := vals[3].(int64)
		d.Replicas = int(n)
		if perr != nil {
			return nil, fmt.Errorf("RLQS ledger: %w", perr)
		}
		out[i] = d
	}
	return out, nil
}
