// Command rlqs-sim runs the standard RLQS scenarios (rlqs/rlqssim): a fleet
// of simulated Envoy rate_limit_quota filters against Leapgate's RLQS
// server, and prints their scores as a Markdown table.
//
// Usage:
//
//	go run ./cmd/rlqs-sim [-reports 1s,5s] [-run regexp] [-replicas N [-redis host:port]] [-addr host:port [-token T]]
//
// Without -addr the server runs in this process on a virtual clock (each
// 60 s scenario takes a fraction of a second). With -replicas N (N > 1),
// N such servers share each limit's division through redisstore's
// QuotaLedger on one Redis (-redis, or a redis-server this command starts
// on a free port), the fleet's streams spread over them in turn; the
// restart scenario is skipped, since the ledger times its claims by
// Redis's real clock. With -addr the fleet talks to a running binary over
// gRPC in real time (the binary must serve rlqssim.Rules; the restart
// scenario is skipped).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/rlqs"
	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/rlqs/rlqssim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rlqs-sim:", err)
		os.Exit(2)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rlqs-sim", flag.ContinueOnError)
	reports := fs.String("reports", "1s,5s", "comma-separated report intervals of the simulated filters")
	match := fs.String("run", "", "run only the scenarios whose name matches this regexp")
	addr := fs.String("addr", "", "a running Leapgate's gRPC address (default: a server in this process, on a virtual clock)")
	token := fs.String("token", "", "with -addr: the FEED_TOKEN to send")
	tick := fs.Duration("tick", 500*time.Millisecond, "in process: RLQS_TICK")
	ttl := fs.Duration("ttl", 4*time.Second, "in process: RLQS_ASSIGNMENT_TTL")
	replicas := fs.Int("replicas", 1, "in process: the number of replicas sharing the limits through Redis")
	redisAddr := fs.String("redis", "", "with -replicas: the Redis to share them on (default: a redis-server started on a free port)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *replicas < 1 || (*replicas > 1 && *addr != "") {
		return errors.New("-replicas: at least 1, and only without -addr")
	}
	if *replicas > 1 && *redisAddr == "" {
		cmd, a, err := redistest.Spawn(context.Background())
		if err != nil {
			return err
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		*redisAddr = a
	}
	re, err := regexp.Compile(*match)
	if err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	set, err := rlqssim.RuleSet()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "| scenario | peak / limit | settled peak | used (steady) | fairness error | converged after | admitted / s | max-min / s | protocol errors |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---|---|---|---:|")
	runs := 0
	for _, r := range strings.Split(*reports, ",") {
		report, err := time.ParseDuration(strings.TrimSpace(r))
		if err != nil {
			return fmt.Errorf("-reports: %w", err)
		}
		for _, sc := range rlqssim.Scenarios(report) {
			if !re.MatchString(sc.Name) || ((*addr != "" || *replicas > 1) && len(sc.Restarts) > 0) {
				continue
			}
			runs++
			tr, closeTr, err := transport(target{*addr, *token, *redisAddr, *replicas, runs}, set, rlqs.Options{Tick: *tick, AssignmentTTL: *ttl})
			if err != nil {
				return err
			}
			res := rlqssim.Run(sc, tr)
			closeTr()
			fmt.Fprintf(out, "| %s | %.3f | %.3f | %.1f %% (%.1f %%) | %.1f %% | %s | %s | %s | %d |\n", sc.Name, res.Peak, res.PeakSettled,
				100*res.Used, 100*res.UsedLast, 100*res.FairnessError, durations(res.Converged), floats(res.Rates), floats(res.Targets), len(res.Errors))
		}
	}
	return nil
}

// target is what the fleet talks to: a binary at addr, or replicas in
// this process sharing a Redis at redisAddr (each run under its own key
// prefix, so that one run's claims, held for their hold in Redis's time,
// do not weigh on the next), or one server in this process.
type target struct {
	addr, token, redisAddr string
	replicas, run          int
}

func transport(to target, set *descriptors.Set, opts rlqs.Options) (rlqssim.Transport, func(), error) {
	addr, token := to.addr, to.token
	if to.replicas > 1 {
		store, err := redisstore.New(context.Background(), redisstore.Options{Addrs: []string{to.redisAddr}, Timeout: 2 * time.Second,
			KeyPrefix: fmt.Sprintf("rlqs-sim:%d:%d:", time.Now().UnixNano(), to.run)})
		if err != nil {
			return nil, nil, fmt.Errorf("-redis: %w", err)
		}
		ledgers := make([]quota.Ledger, to.replicas)
		for i := range ledgers {
			ledgers[i] = store.QuotaLedger()
		}
		tr, err := rlqssim.NewReplicas(set, opts, ledgers)
		if err != nil {
			store.Close()
			return nil, nil, err
		}
		return tr, func() { store.Close() }, nil
	}
	if addr == "" {
		tr, err := rlqssim.NewInProcess(set, opts)
		return tr, func() {}, err
	}
	tr, err := rlqssim.DialGRPC(addr, token)
	if err != nil {
		return nil, nil, errors.Join(errors.New("dialing "+addr), err)
	}
	return tr, func() { tr.Close() }, nil
}

func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "—"
	}
	var s []string
	for _, d := range ds {
		if d < 0 {
			s = append(s, "never")
			continue
		}
		s = append(s, fmt.Sprintf("%.1f s", d.Seconds()))
	}
	return strings.Join(s, ", ")
}

func floats(fs []float64) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%.0f", f))
	}
	return strings.Join(s, ", ")
}
