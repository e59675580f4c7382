package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/leapgate/leapgate/window"
)

// maxNodes bounds the descriptors and list items read from one file, so that
// YAML aliases cannot expand a small file into an enormous tree.
const maxNodes = 100000

// Fields allowed at each level of a rule file.
var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "quota_mode", "metadata", "circuit_breaker",
		"concurrency_limit"}
	concurrencyFields = []string{"max_in_flight", "lease", "holder_key"}
	rateLimitFields   = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "window", "buckets", "algorithm", "charge"}
	replacesFields = []string{"name"}
	breakerFields  = []string{"strategy", "threshold", "max_response_time", "error_statuses", "min_requests",
		"window", "buckets", "open_duration", "max_open_duration", "half_open_probes", "probe_timeout", "ramp_duration"}
)

// reader turns one YAML rule file into a rawFile, collecting errors.
type reader struct {
	file     string
	errs     []error
	nodes    int                 // list items read so far
	tooLarge bool                // maxNodes exceeded (reported once)
	active   map[*yaml.Node]bool // descriptors lists being read, to catch alias cycles
}

// maxErrors bounds the errors reported per file.
const maxErrors = 100

func (r *reader) errorf(line int, format string, args ...any) {
	switch {
	case len(r.errs) < maxErrors:
		r.errs = append(r.errs, &Error{File: r.file, Line: line, Reason: fmt.Sprintf(format, args...)})
	case len(r.errs) == maxErrors:
		r.errs = append(r.errs, &Error{File: r.file, Line: line, Reason: "too many errors; stopped reporting"})
	}
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// decodeYAML parses data into a document node. The parser's own errors are
// reported with the line it names.
func (r *reader) decodeYAML(data []byte) (doc *yaml.Node, ok bool) {
	defer func() {
		// yaml.v3 has panicked on hostile input in the past; a rule file
		// must never take the process down.
		if p := recover(); p != nil {
			r.errorf(0, "error loading config file: yaml: %v", p)
			doc, ok = nil, false
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first yaml.Node
	if err := dec.Decode(&first); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, true // an empty file: reported as an empty domain
		}
		r.parserError(err)
		return nil, false
	}
	var second yaml.Node
	switch err := dec.Decode(&second); {
	case errors.Is(err, io.EOF):
	case err != nil:
		r.parserError(err)
		return nil, false
	default:
		r.errorf(second.Line, "a rule file must hold a single YAML document")
		return nil, false
	}
	return &first, true
}

// parserProblems are the problems yaml.v3's parser (as opposed to its
// scanner) reports. For these it names the 0-based line of the enclosing
// block's start, which parserError turns into that block's 1-based line.
var parserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

func (r *reader) parserError(err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
		if parserProblems[msg] {
			line++
		}
		msg = fmt.Sprintf("yaml: line %d: %s", line, msg)
	}
	r.errorf(line, "error loading config file: %s", msg)
	if e, ok := r.errs[len(r.errs)-1].(*Error); ok && line > 0 {
		e.lineInReason = true
	}
}

// parseYAML reads one rule file. The rawFile is nil when the file could not
// be read at all; otherwise errors may still have been reported.
func parseYAML(name string, data []byte) (*rawFile, []error) {
	r := &reader{file: name}
	doc, ok := r.decodeYAML(data)
	if !ok {
		return nil, r.errs
	}
	f := &rawFile{name: name, line: 1}
	if doc == nil || len(doc.Content) == 0 {
		return f, r.errs
	}
	root := r.resolve(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return f, r.errs
	}
	if root.Kind != yaml.MappingNode {
		r.errorf(root.Line, "config error, a rule file must be a YAML mapping with domain and descriptors")
		return nil, r.errs
	}
	f.line = root.Line
	r.fields(root, rootFields, func(name string, key, val *yaml.Node) {
		switch name {
		case "domain":
			f.line = key.Line
			var ok bool
			f.domain, ok = r.str(name, val)
			f.bad = !ok
		case "descriptors":
			f.descriptors = r.descriptors(val)
		}
	})
	return f, r.errs
}

func (r *reader) descriptors(n *yaml.Node) []*rawDescriptor {
	if r.active[n] {
		r.errorf(n.Line, "config error, descriptors refer to themselves through a YAML alias")
		return nil
	}
	if r.active == nil {
		r.active = map[*yaml.Node]bool{}
	}
	r.active[n] = true
	defer delete(r.active, n)
	var out []*rawDescriptor
	for _, it := range r.list("descriptors", n) {
		out = append(out, r.descriptor(it))
	}
	return out
}

func (r *reader) descriptor(n *yaml.Node) *rawDescriptor {
	d := &rawDescriptor{line: n.Line, lines: map[string]int{}}
	r.fields(n, descriptorFields, func(name string, key, val *yaml.Node) {
		d.lines[name] = val.Line
		switch name {
		case "key", "value":
			v, ok := r.str(name, val)
			d.bad = d.bad || !ok
			if name == "key" {
				d.key = v
			} else {
				d.value = v
			}
		case "rate_limit":
			if r.mapping(name, val) {
				d.limits = append([]*rawLimit{r.rateLimit(val)}, d.limits...)
			}
		case "rate_limits":
			for _, it := range r.list(name, val) {
				d.limits = append(d.limits, r.rateLimit(it))
			}
		case "descriptors":
			d.children = r.descriptors(val)
		case "shadow_mode":
			d.shadowMode = r.boolean(name, val)
		case "detailed_metric":
			d.detailedMetric = r.boolean(name, val)
		case "value_to_metric":
			d.valueToMetric = r.boolean(name, val)
		case "share_threshold":
			d.shareThreshold = r.boolean(name, val)
		case "quota_mode":
			d.quotaMode = r.boolean(name, val)
		case "metadata":
			if r.mapping(name, val) {
				if err := val.Decode(&d.metadata); err != nil {
					r.errorf(val.Line, "error parsing metadata: %v", err)
				}
			}
		case "circuit_breaker":
			if r.mapping(name, val) {
				d.breaker = r.breaker(val)
			}
		case "concurrency_limit":
			if r.mapping(name, val) {
				d.concurrency = r.concurrency(val)
			}
		}
	})
	return d
}

// concurrency reads a concurrency_limit block; the builder validates it.
func (r *reader) concurrency(n *yaml.Node) *rawConcurrency {
	c := &rawConcurrency{line: n.Line, lines: map[string]int{}}
	before := len(r.errs)
	r.fields(n, concurrencyFields, func(name string, _, val *yaml.Node) {
		c.lines[name] = val.Line
		switch name {
		case "max_in_flight":
			u, ok := r.unsigned(name, val, math.MaxUint32)
			c.maxInFlight, c.maxSet = uint32(u), ok
		case "lease":
			c.lease, c.leaseSet = r.duration(name, val)
		case "holder_key":
			c.holderKey, _ = r.str(name, val)
		}
	})
	c.bad = len(r.errs) > before
	return c
}

func (r *reader) rateLimit(n *yaml.Node) *rawLimit {
	l := &rawLimit{line: n.Line, lines: map[string]int{}}
	before := len(r.errs)
	defer func() { l.bad = len(r.errs) > before }()
	r.fields(n, rateLimitFields, func(name string, key, val *yaml.Node) {
		l.lines[name] = val.Line
		switch name {
		case "unit":
			l.unit, _ = r.str(name, val)
		case "requests_per_unit":
			u, _ := r.unsigned(name, val, math.MaxUint32)
			l.requestsPerUnit = uint32(u)
		case "unlimited":
			l.unlimited = r.boolean(name, val)
		case "name":
			l.name, _ = r.str(name, val)
		case "replaces":
			for _, it := range r.list(name, val) {
				rep := rawReplace{line: it.Line}
				r.fields(it, replacesFields, func(_ string, _, v *yaml.Node) {
					rep.name, _ = r.str("name", v)
				})
				l.replaces = append(l.replaces, rep)
			}
		case "unit_multiplier":
			u, ok := r.unsigned(name, val, math.MaxUint32)
			l.unitMultiplier, l.multiplierSet = uint32(u), ok
		case "window":
			l.window, _ = r.duration(name, val)
		case "buckets":
			u, ok := r.unsigned(name, val, math.MaxInt32)
			l.buckets, l.bucketsSet = int(u), ok
		case "charge":
			l.charge, l.chargeSet = r.str(name, val)
		case "algorithm":
			s, _ := r.str(name, val)
			if a, ok := window.ParseAlgorithm(s); ok {
				l.algorithm, l.algorithmSet = a, true
			} else {
				r.errorf(val.Line, "config error, unknown algorithm '%s' (want %s)", s, list(window.RuleAlgorithmNames(), "or"))
			}
		}
	})
	return l
}

// breaker reads and validates a circuit_breaker block, filling defaults.
func (r *reader) breaker(n *yaml.Node) *Breaker {
	b := &Breaker{OpenDuration: DefaultBreakerOpenDuration, HalfOpenProbes: DefaultHalfOpenProbes}
	length, buckets := DefaultBreakerWindow, DefaultBreakerBuckets
	lines := map[string]int{}
	valid := true
	var strategy string
	var probeTimeoutSet, thresholdSet bool
	r.fields(n, breakerFields, func(name string, key, val *yaml.Node) {
		lines[name] = val.Line
		ok := true
		switch name {
		case "strategy":
			strategy, ok = r.str(name, val)
		case "threshold":
			if val.Kind != yaml.ScalarNode || val.Decode(&b.Threshold) != nil || math.IsNaN(b.Threshold) {
				r.errorf(val.Line, "config error, threshold must be a number, got %s", describe(val))
				ok = false
			}
			thresholdSet = true
		case "max_response_time":
			b.MaxResponseTime, ok = r.duration(name, val)
		case "error_statuses":
			if isNull(val) {
				break
			}
			if val.Kind != yaml.SequenceNode {
				r.errorf(val.Line, "config error, error_statuses must be a list of HTTP statuses, got %s", describe(val))
				ok = false
				break
			}
			for _, it := range val.Content {
				it = r.resolve(it)
				var s int
				if it.Kind != yaml.ScalarNode || it.Decode(&s) != nil || s < 100 || s > 599 {
					r.errorf(it.Line, "config error, error_statuses must hold HTTP statuses (100-599), got %s", describe(it))
					ok = false
					continue
				}
				b.ErrorStatuses = append(b.ErrorStatuses, s)
			}
			slices.Sort(b.ErrorStatuses)
		case "min_requests":
			b.MinRequests, ok = r.unsigned(name, val, math.MaxUint32)
		case "window":
			length, ok = r.duration(name, val)
		case "buckets":
			var u uint64
			u, ok = r.unsigned(name, val, math.MaxInt32)
			buckets = int(u)
		case "open_duration":
			b.OpenDuration, ok = r.duration(name, val)
		case "max_open_duration":
			b.MaxOpenDuration, ok = r.duration(name, val)
		case "half_open_probes":
			var u uint64
			u, ok = r.unsigned(name, val, math.MaxUint32)
			b.HalfOpenProbes = uint32(u)
		case "probe_timeout":
			b.ProbeTimeout, ok = r.duration(name, val)
			probeTimeoutSet = true
		case "ramp_duration":
			b.RampDuration, ok = r.duration(name, val)
		}
		valid = valid && ok
	})
	line := func(field string) int { return at(lines, field, n.Line) }
	known := false
	b.Strategy, known = parseBreakerStrategy(strategy)
	switch {
	case strategy == "":
		r.errorf(line("strategy"), "circuit_breaker: strategy is required (slow_request_ratio, error_ratio, error_count or latency_percentile)")
		valid = false
	case !known:
		r.errorf(line("strategy"), "circuit_breaker: unknown strategy '%s' (want slow_request_ratio, error_ratio, error_count or latency_percentile)", strategy)
		valid = false
	case b.Strategy == ErrorCount:
		if thresholdSet && (b.Threshold < 1 || b.Threshold != math.Trunc(b.Threshold)) {
			r.errorf(line("threshold"), "circuit_breaker: threshold of strategy error_count must be a whole number of at least 1, got %g", b.Threshold)
			valid = false
		}
	default: // the ratio strategies
		if b.Strategy.Timed() && b.MaxResponseTime <= 0 && valid {
			r.errorf(line("max_response_time"), "circuit_breaker: max_response_time is required for strategy %s", b.Strategy)
			valid = false
		}
		if thresholdSet && (b.Threshold <= 0 || b.Threshold > 1) {
			what := "a ratio strategy"
			if b.Strategy == LatencyPercentile {
				what = "latency_percentile (the percentile as a fraction, e.g. 0.99)"
			}
			r.errorf(line("threshold"), "circuit_breaker: threshold of %s must be in (0,1], got %g", what, b.Threshold)
			valid = false
		}
	}
	if !thresholdSet && strategy != "" {
		r.errorf(line("threshold"), "circuit_breaker: threshold is required")
		valid = false
	}
	if !b.Strategy.Timed() && lines["max_response_time"] > 0 {
		r.errorf(line("max_response_time"), "circuit_breaker: max_response_time applies only to strategies slow_request_ratio and latency_percentile")
		valid = false
	}
	if _, set := lines["buckets"]; set && buckets < 1 {
		r.errorf(line("buckets"), "circuit_breaker: buckets must be at least 1, got %d", buckets)
		valid = false
	} else if length > 0 {
		spec, err := window.NewSpec(length, buckets)
		if err != nil {
			field := "buckets"
			if _, set := lines["buckets"]; !set {
				field = "window"
			}
			r.errorf(line(field), "circuit_breaker: %v", err)
			valid = false
		}
		b.Spec = spec
	}
	if _, set := lines["half_open_probes"]; set && b.HalfOpenProbes < 1 {
		r.errorf(line("half_open_probes"), "circuit_breaker: half_open_probes must be at least 1")
		valid = false
	}
	if _, set := lines["max_open_duration"]; set && b.MaxOpenDuration < b.OpenDuration {
		r.errorf(line("max_open_duration"), "circuit_breaker: max_open_duration %v is shorter than open_duration %v", b.MaxOpenDuration, b.OpenDuration)
		valid = false
	}
	if b.MaxOpenDuration < b.OpenDuration {
		b.MaxOpenDuration = b.OpenDuration // no backoff
	}
	if !probeTimeoutSet {
		b.ProbeTimeout = b.OpenDuration
	}
	if !valid {
		return nil
	}
	return b
}
