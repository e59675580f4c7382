package main

import (
	"fmt"
	"io"
	"strings"
)

// Targets for Leapgate's default (issue 7).
const (
	targetFalseRejects = 0.01 // share of requests, steady and Poisson traces
	targetBytesPerKey  = 256
)

// result is one algorithm's figures on one trace.
type result struct {
	trace trace
	outcome
}

// row is one algorithm's figures on every trace, and its cost.
type row struct {
	alg     algorithm
	results []result
	cost    *cost // nil when costs were not measured
}

// share formats n of total as a percentage.
func share(n, total int) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(total))
}

func formatOvershoot(o outcome, limit uint64) string {
	over := o.overshoot(limit)
	if over == 0 {
		return "0"
	}
	return fmt.Sprintf("+%d (%.2fx)", over, float64(o.maxInWindow)/float64(limit))
}

// summary is an algorithm's worst figures over the traces.
type summary struct {
	worstOvershoot uint64
	worstTrace     string
	// worst false-reject shares on the steady and Poisson traces.
	falseRejects, vsIdeal float64
	falseTrace            string
	// shortfall is the largest share of the ideal's admitted hits that the
	// algorithm did not admit, on the steady and Poisson traces.
	shortfall      float64
	shortfallTrace string
}

func summarize(r row, limit uint64) summary {
	var s summary
	for _, res := range r.results {
		if over := res.overshoot(limit); over > s.worstOvershoot {
			s.worstOvershoot, s.worstTrace = over, res.trace.name
		}
		if res.trace.group != "steady" && res.trace.group != "poisson" || res.requests == 0 {
			continue
		}
		if fr := float64(res.falseRejects) / float64(res.requests); fr > s.falseRejects {
			s.falseRejects, s.falseTrace = fr, res.trace.name
		}
		s.vsIdeal = max(s.vsIdeal, float64(res.refusedIdealAdmits)/float64(res.requests))
		if sf := -res.vsIdealHits(); sf > s.shortfall {
			s.shortfall, s.shortfallTrace = sf, res.trace.name
		}
	}
	return s
}

// meetsTargets reports whether an algorithm meets the default's targets: 0
// overshoot everywhere, false rejects (own log) <= 1% on steady and Poisson
// traces, <= 256 bytes per active key.
func meetsTargets(s summary, c *cost) string {
	var miss []string
	if s.worstOvershoot > 0 {
		miss = append(miss, "overshoot")
	}
	if s.falseRejects > targetFalseRejects {
		miss = append(miss, "false rejects")
	}
	if c == nil {
		if len(miss) == 0 {
			return "yes (memory not measured)"
		}
	} else if c.bytesPerKey > targetBytesPerKey {
		miss = append(miss, "memory")
	}
	if len(miss) == 0 {
		return "yes"
	}
	return "no: " + strings.Join(miss, ", ")
}

// storeCost is the memory of one active key held by a window.Store.
type storeCost struct {
	buckets, keys, keyLen int
	bytesPerKey           float64
}

// writeReport prints the summary table, the Store's memory per key (if
// measured) and the per-trace table, in markdown.
func writeReport(w io.Writer, cfg config, rows []row, store *storeCost) {
	p := cfg.params
	fmt.Fprintf(w, "Limit %d hits per %v window; open-loop traces %d windows long; seed %d.\n\n",
		p.limit, p.window, cfg.windows, cfg.seed)

	fmt.Fprintln(w, "### Summary")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| algorithm | worst overshoot (trace) | worst false rejects, own log, steady+Poisson (trace) | worst refused though ideal admits, steady+Poisson | worst shortfall of admitted hits vs ideal, steady+Poisson (trace) | bytes per active key | ns per decision (indicative) | meets default's targets |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		s := summarize(r, p.limit)
		over := "0"
		if s.worstOvershoot > 0 {
			over = fmt.Sprintf("+%d (%s)", s.worstOvershoot, s.worstTrace)
		}
		fr := fmt.Sprintf("%.2f%%", 100*s.falseRejects)
		if s.falseRejects > 0 {
			fr += " (" + s.falseTrace + ")"
		}
		sf := fmt.Sprintf("%.2f%%", 100*s.shortfall)
		if s.shortfall > 0 {
			sf += " (" + s.shortfallTrace + ")"
		}
		bytes, ns := "-", "-"
		if r.cost != nil {
			bytes = fmt.Sprintf("%.0f", r.cost.bytesPerKey)
			ns = fmt.Sprintf("%.0f", r.cost.nsPerDecision)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f%% | %s | %s | %s | %s |\n",
			r.alg.name, over, fr, 100*s.vsIdeal, sf, bytes, ns, meetsTargets(s, r.cost))
	}

	if store != nil {
		fmt.Fprintf(w, "\nIn a window.Store (counter, map entry and a %d-byte key), %d buckets, %d active keys: %.0f bytes per key.\n",
			store.keyLen, store.buckets, store.keys, store.bytesPerKey)
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Per trace")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| trace | algorithm | requests | admitted hits / ideal's (difference) | overshoot | false rejects (own log) | refused though ideal admits |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	if len(rows) == 0 {
		return
	}
	for i := range rows[0].results {
		for _, r := range rows {
			res := r.results[i]
			fmt.Fprintf(w, "| %s | %s | %d | %d / %d (%+.2f%%) | %s | %s | %s |\n",
				res.trace.name, r.alg.name, res.requests, res.admittedHits, res.idealHits, 100*res.vsIdealHits(),
				formatOvershoot(res.outcome, p.limit), share(res.falseRejects, res.requests),
				share(res.refusedIdealAdmits, res.requests))
		}
	}
}
