// Command accuracy replays traffic traces through Leapgate's sliding window
// and through models of other admission algorithms on a virtual clock (no
// sleeping, fixed random seeds), compares every run with an exact sliding
// log, and prints the figures as markdown tables.
//
// Usage:
//
//	go run ./cmd/accuracy [-limits 10,100,1000,10000] [-window 1s] [-seed 1] [-buckets 20,60,100]
//
// The headline is the capacity shortfall: what an exact sliding log admits
// on the same arrivals and the algorithm does not, as a share of the log's
// admissions. See docs/accuracy.md for what each figure means.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is everything a run depends on.
type config struct {
	params
	traceParams
	seed    uint64
	buckets []int // bucket counts of window.BucketCounter (time_buckets) to compare
	// limits are the limits to report, one section each (params.limit is
	// the one being run).
	limits []uint64
	// costKeys is the number of keys for bytes per key; 0 skips the cost
	// measurements (they are not deterministic).
	costKeys int
	// costDecisions is the length of the timing loop.
	costDecisions int
	// storeKeys is the number of keys put in a window.Store to measure its
	// memory per key (0 skips it; so does costKeys 0).
	storeKeys int
}

func main() {
	cfg := config{}
	var buckets, limits string
	flag.StringVar(&limits, "limits", "100", "comma-separated limits (hits allowed per window on every key), one report section each")
	flag.DurationVar(&cfg.window, "window", time.Second, "window length")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the random traces")
	flag.IntVar(&cfg.windows, "windows", 30, "length of each open-loop trace, in windows")
	flag.IntVar(&cfg.keys, "keys", 1000, "number of keys of the Zipf trace")
	flag.StringVar(&buckets, "buckets", "20,50,100", "bucket counts of Leapgate's time_buckets to compare (each must divide the window: 60 does not divide 1s)")
	flag.IntVar(&cfg.costKeys, "cost-keys", 4096, "keys over which bytes per key is measured (0: skip bytes and ns per decision)")
	flag.IntVar(&cfg.costDecisions, "cost-decisions", 500000, "decisions in the ns-per-decision timing loop")
	flag.IntVar(&cfg.storeKeys, "store-keys", 100000, "keys put in a window.Store to measure its bytes per key (0: skip)")
	flag.Parse()

	var err error
	if cfg.buckets, err = parseList(buckets, "bucket count", strconv.Atoi); err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(2)
	}
	if cfg.limits, err = parseList(limits, "limit", func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 32) }); err != nil || len(cfg.limits) == 0 {
		fmt.Fprintln(os.Stderr, "accuracy: -limits:", err)
		os.Exit(2)
	}
	if err := runAll(os.Stdout, os.Stderr, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(2)
	}
}

// parseList reads a comma-separated list of positive numbers, sorted and
// without repeats.
func parseList[T int | uint64](s, what string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := parse(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s %q: want a positive integer", what, f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// runAll runs every limit of cfg.limits (costs are measured with the
// first), then, for several limits, prints the default sliding window's
// shortfall per trace at each; it returns the errors of all.
func runAll(out, warn io.Writer, cfg config) error {
	var errs []error
	var defaults []row // the default's row at each limit
	for i, l := range cfg.limits {
		c := cfg
		c.limit = l
		if i > 0 {
			c.costKeys, c.storeKeys = 0, 0
			fmt.Fprintln(out)
		}
		rows, err := run(out, warn, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("limit %d: %w", l, err))
		}
		if len(rows) > 0 && rows[0].alg.noBurst && rows[0].alg.buckets == 0 {
			defaults = append(defaults, rows[0])
		}
	}
	if len(defaults) > 1 && len(defaults) == len(cfg.limits) {
		fmt.Fprintln(out)
		writeAcrossLimits(out, cfg.limits, defaults)
	}
	return errors.Join(errs...)
}

// algorithms returns the algorithms to compare, in table order. Bucket
// counts that do not divide the window are reported on warn and skipped.
func algorithms(cfg config, warn io.Writer) []algorithm {
	def, err := slidingWindowAlgorithm(cfg.params)
	if err != nil {
		fmt.Fprintf(warn, "accuracy: skipping the default sliding window: %v\n", err)
	}
	algs := []algorithm{def, exactLogAlgorithm(cfg.params), envoyAlgorithm(cfg.params), sentinelAlgorithm(cfg.params), gcraAlgorithm(cfg.params)}
	if err != nil {
		algs = algs[1:]
	}
	for _, b := range cfg.buckets {
		a, err := timeBucketsAlgorithm(cfg.params, b)
		if err != nil {
			fmt.Fprintf(warn, "accuracy: skipping %d buckets: %v\n", b, err)
			continue
		}
		algs = append(algs, a)
	}
	more, err := otherWindowAlgorithms(cfg.params)
	if err != nil {
		fmt.Fprintf(warn, "accuracy: skipping window's token bucket and fixed window: %v\n", err)
	}
	return append(algs, more...)
}

// run simulates every trace through every algorithm and writes the report.
// run simulates every trace through every algorithm at cfg.limit, writes
// the report and returns the rows (the default sliding window first).
func run(out, warn io.Writer, cfg config) ([]row, error) {
	switch {
	case cfg.limit < 1:
		return nil, fmt.Errorf("limit must be at least 1")
	case cfg.window < time.Millisecond:
		return nil, fmt.Errorf("window %v: want at least 1ms", cfg.window)
	case cfg.windows < 1:
		return nil, fmt.Errorf("windows must be at least 1")
	case cfg.keys < 1:
		return nil, fmt.Errorf("keys must be at least 1")
	}
	rows := evaluate(cfg, algorithms(cfg, warn))
	var store *storeCost
	if cfg.costKeys > 0 && cfg.storeKeys > 0 {
		b, err := measureStoreBytesPerKey(cfg.params, cfg.storeKeys)
		if err != nil {
			return rows, fmt.Errorf("measuring the store: %w", err)
		}
		store = &storeCost{keys: cfg.storeKeys, keyLen: len(storeKey(0)), bytesPerKey: b}
	}
	writeReport(out, cfg, rows, store)
	return rows, checkGuarantees(cfg.params, rows)
}

// checkGuarantees returns an error if Leapgate's sliding window overshot on
// any trace, or if the exact sliding log (the metrics' self-check) did not
// come out ideal: the command then exits non-zero after printing the tables.
func checkGuarantees(p params, rows []row) error {
	var errs []error
	for _, r := range rows {
		for _, res := range r.results {
			switch {
			case r.alg.noBurst && res.overshoot(p.limit) > 0:
				errs = append(errs, fmt.Errorf("%s admitted %d hits in one window on %q (limit %d)",
					r.alg.name, res.maxInWindow, res.trace.name, p.limit))
			case r.alg.exact && (res.overshoot(p.limit) > 0 || res.falseRejects > 0 || res.refusedIdealAdmits > 0):
				errs = append(errs, fmt.Errorf("%s is not ideal on %q: %+v", r.alg.name, res.trace.name, res.outcome))
			}
		}
	}
	return errors.Join(errs...)
}

// evaluate runs every trace through every algorithm (and measures costs if
// asked).
func evaluate(cfg config, algs []algorithm) []row {
	ts := traces(cfg.traceParams)
	rows := make([]row, len(algs))
	for i, alg := range algs {
		rows[i].alg = alg
		for j, tr := range ts {
			events := simulate(cfg.params, cfg.traceParams, alg, tr, cfg.seed, uint64(j))
			rows[i].results = append(rows[i].results, result{trace: tr, outcome: measure(cfg.params, events)})
		}
		if cfg.costKeys > 0 {
			rows[i].cost = &cost{
				bytesPerKey:   measureBytesPerKey(cfg.params, alg, cfg.costKeys),
				nsPerDecision: measureNsPerDecision(cfg.params, alg, cfg.costDecisions),
			}
		}
	}
	return rows
}
