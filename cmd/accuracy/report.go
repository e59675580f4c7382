package main

import (
	"fmt"
	"io"
	"strings"
)

// Targets of Leapgate's default sliding window.
const (
	targetShortfall   = 0.01 // of an exact log's admissions, on every open-loop trace
	targetBytesPerKey = 256
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

// shortfall is the share of the exact log's admitted hits that the
// algorithm did not admit (negative when it admitted more).
func (o outcome) shortfall() float64 { return -o.vsIdealHits() }

// percent formats a share as a percentage (a negative shortfall: more
// admitted than the exact log, i.e. overshoot).
func percent(x float64) string {
	s := fmt.Sprintf("%.2f%%", 100*x)
	if s == "-0.00%" {
		return "0.00%"
	}
	return s
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
	overshootTrace string
	// shortfall is the largest shortfall on an open-loop trace.
	shortfall      float64
	shortfallTrace string
	// falseRejects is the largest share of requests refused while the log
	// of the algorithm's own admissions showed room, on traces within the
	// limit.
	falseRejects float64
	falseTrace   string
}

func summarize(r row, limit uint64) summary {
	var s summary
	for _, res := range r.results {
		if over := res.overshoot(limit); over > s.worstOvershoot {
			s.worstOvershoot, s.overshootTrace = over, res.trace.name
		}
		if res.trace.adaptive || res.requests == 0 {
			continue
		}
		if sf := res.shortfall(); sf > s.shortfall || s.shortfallTrace == "" {
			s.shortfall, s.shortfallTrace = sf, res.trace.name
		}
		if !res.trace.withinLimit {
			continue
		}
		if fr := float64(res.falseRejects) / float64(res.requests); fr > s.falseRejects {
			s.falseRejects, s.falseTrace = fr, res.trace.name
		}
	}
	return s
}

// meetsTargets says whether an algorithm meets the default's targets: 0
// overshoot everywhere, a shortfall of at most 1% on every open-loop trace,
// at most 256 bytes per active key.
func meetsTargets(s summary, c *cost) string {
	var miss []string
	if s.worstOvershoot > 0 {
		miss = append(miss, "overshoot")
	}
	if s.shortfall > targetShortfall {
		miss = append(miss, "shortfall")
	}
	if c != nil && c.bytesPerKey > targetBytesPerKey {
		miss = append(miss, "memory")
	}
	switch {
	case len(miss) > 0:
		return "no: " + strings.Join(miss, ", ")
	case c == nil:
		return "yes (memory not measured)"
	}
	return "yes"
}

// storeCost is the memory of one active key held by a window.Store.
type storeCost struct {
	keys, keyLen int
	bytesPerKey  float64
}

// writeReport prints the summary table, the Store's memory per key (if
// measured), the shortfall per trace and the per-trace details, in
// markdown.
func writeReport(w io.Writer, cfg config, rows []row, store *storeCost) {
	p := cfg.params
	fmt.Fprintf(w, "## Limit %d per %v\n\nOpen-loop traces %d windows long; seed %d. Shortfall: what an exact sliding log admits on the same arrivals and the algorithm does not, as a share of the log's admissions.\n\n",
		p.limit, p.window, cfg.windows, cfg.seed)

	fmt.Fprintln(w, "### Summary")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| algorithm | worst overshoot (trace) | worst shortfall vs exact log (trace) | worst false rejects, own log, traces within the limit (trace) | bytes per active key | ns per decision (indicative) | meets the default's targets |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		s := summarize(r, p.limit)
		over := "0"
		if s.worstOvershoot > 0 {
			over = fmt.Sprintf("+%d (%s)", s.worstOvershoot, s.overshootTrace)
		}
		sf := percent(s.shortfall)
		if s.shortfall > 0 {
			sf += " (" + s.shortfallTrace + ")"
		}
		fr := percent(s.falseRejects)
		if s.falseRejects > 0 {
			fr += " (" + s.falseTrace + ")"
		}
		bytes, ns := "-", "-"
		if r.cost != nil {
			bytes = fmt.Sprintf("%.0f", r.cost.bytesPerKey)
			ns = fmt.Sprintf("%.0f", r.cost.nsPerDecision)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.alg.name, over, sf, fr, bytes, ns, meetsTargets(s, r.cost))
	}
	if store != nil {
		fmt.Fprintf(w, "\nIn a window.Store (counter and map entry; the Store keeps a digest, not the %d-byte key), %d active keys of the default sliding window: %.0f bytes per key.\n",
			store.keyLen, store.keys, store.bytesPerKey)
	}
	if len(rows) == 0 {
		return
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Shortfall per trace")
	fmt.Fprintln(w)
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.alg.name
	}
	writeShortfalls(w, names, rows)

	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Per trace")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| trace | algorithm | requests | admitted hits / exact log's (shortfall) | overshoot | false rejects (own log; traces within the limit) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for i := range rows[0].results {
		for _, r := range rows {
			res := r.results[i]
			sf, fr := "-", "-"
			if !res.trace.adaptive {
				sf = percent(res.shortfall())
			}
			if res.trace.withinLimit && res.requests > 0 {
				fr = percent(float64(res.falseRejects) / float64(res.requests))
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d / %d (%s) | %s | %s |\n",
				res.trace.name, r.alg.name, res.requests, res.admittedHits, res.idealHits, sf,
				formatOvershoot(res.outcome, p.limit), fr)
		}
	}
}

// writeAcrossLimits prints the default sliding window's shortfall per trace
// (rows) at each limit (columns): defaults[i] is its row at limits[i].
func writeAcrossLimits(w io.Writer, limits []uint64, defaults []row) {
	fmt.Fprintf(w, "## %s: shortfall vs the exact log, per limit\n\n", defaults[0].alg.name)
	names := make([]string, len(limits))
	for i, l := range limits {
		names[i] = fmt.Sprintf("limit %d", l)
	}
	writeShortfalls(w, names, defaults)
	fmt.Fprint(w, "| **worst overshoot, every trace** |")
	for i, d := range defaults {
		fmt.Fprintf(w, " %d |", summarize(d, limits[i]).worstOvershoot)
	}
	fmt.Fprintln(w)
}

// writeShortfalls prints a markdown table of shortfalls: a line per
// open-loop trace, a column per row (headed by names[i]); the rows share
// their traces.
func writeShortfalls(w io.Writer, names []string, rows []row) {
	fmt.Fprint(w, "| trace |")
	for _, n := range names {
		fmt.Fprintf(w, " %s |", n)
	}
	fmt.Fprint(w, "\n| --- |")
	for range names {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	for i, res := range rows[0].results {
		if res.trace.adaptive {
			continue
		}
		fmt.Fprintf(w, "| %s |", res.trace.name)
		for _, r := range rows {
			fmt.Fprintf(w, " %s |", percent(r.results[i].shortfall()))
		}
		fmt.Fprintln(w)
	}
}
