package breaker

import (
	"fmt"
	"strings"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/envoyhdr"
)

// Sources of observations, the values of the source label.
const (
	SourceExtProc = "ext_proc"
	// SourceExtProcInFlight marks the early signal of an ext_proc request
	// still open past a breaker's max_response_time.
	SourceExtProcInFlight = "ext_proc_inflight"
	SourceALS             = "als"
	SourceReport          = "report"
)

// Observation is the outcome of one upstream request, as reported by Envoy
// (ext_proc, access log) or by a caller (JSON report).
type Observation struct {
	// Route is the route name (Envoy's xds.route_name / route_name).
	Route string
	// Cluster is the upstream cluster (xds.cluster_name / upstream_cluster),
	// or the resource named by a JSON report.
	Cluster string
	// Headers are request headers (lower-case name, value); those named in
	// the registry's Mapping become descriptor entries, and envoyhdr.ProbeHeader
	// names the probes the request was admitted as.
	Headers []descriptors.Entry
	// ResponseTime, Status, Aborted, Error and InFlight are the outcome (see
	// Outcome).
	ResponseTime time.Duration
	Status       int
	Aborted      bool
	Error        bool
	InFlight     bool
	// Source names where the observation came from (Source* constants).
	Source string
	// RequestID is Envoy's request ID (x-request-id), if known: a request
	// reported by both ext_proc and the access-log service is counted once.
	RequestID string
}

func (o *Observation) outcome() Outcome {
	out := Outcome{ResponseTime: o.ResponseTime, Status: o.Status, Aborted: o.Aborted, Error: o.Error, InFlight: o.InFlight}
	for _, h := range o.Headers {
		if h.Key == envoyhdr.ProbeHeader && len(out.Probes) < envoyhdr.MaxProbeIDs {
			out.Probes = append(out.Probes, envoyhdr.ParseProbes(h.Value)...)
		}
	}
	return out
}

// HeaderKey maps a request header to a descriptor key.
type HeaderKey struct {
	// Header is the lower-case request header name, e.g. x-user-id.
	Header string
	// Key is the descriptor key it yields, e.g. user.
	Key string
}

// Mapping turns an observation into descriptor entries:
//
//	(ClusterKey, Cluster)  when Cluster is not empty
//	(RouteKey, Route)      when Route is not empty
//	(Key, value)           for each configured header present in the request
//
// The defaults, destination_cluster and route, are the entry keys Envoy's
// rate-limit actions produce for `destination_cluster: {}` and for
// `generic_key: {descriptor_key: route, descriptor_value: <route name>}`, so
// a breaker rule written for those descriptors receives the observations of
// the same cluster and route with no further configuration.
type Mapping struct {
	ClusterKey string
	RouteKey   string
	Headers    []HeaderKey
}

// Default entry keys of a Mapping.
const (
	DefaultClusterKey = "destination_cluster"
	DefaultRouteKey   = "route"
)

func (m Mapping) withDefaults() Mapping {
	if m.ClusterKey == "" {
		m.ClusterKey = DefaultClusterKey
	}
	if m.RouteKey == "" {
		m.RouteKey = DefaultRouteKey
	}
	return m
}

// ParseHeaderKeys parses a header mapping setting such as
// "x-user-id=user,x-tenant" (a header without "=key" keeps its own name as
// the key). Header names are lower-cased.
func ParseHeaderKeys(s string) ([]HeaderKey, error) {
	var out []HeaderKey
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		header, key, found := strings.Cut(item, "=")
		header, key = strings.ToLower(strings.TrimSpace(header)), strings.TrimSpace(key)
		if !found {
			key = header
		}
		if header == "" || key == "" {
			return nil, fmt.Errorf("header mapping %q: want header=descriptor_key", item)
		}
		out = append(out, HeaderKey{Header: header, Key: key})
	}
	return out, nil
}

// entries appends the descriptor entries of obs to dst.
func (m *Mapping) entries(dst []descriptors.Entry, obs *Observation) []descriptors.Entry {
	if obs.Cluster != "" {
		dst = append(dst, descriptors.Entry{Key: m.ClusterKey, Value: obs.Cluster})
	}
	if obs.Route != "" {
		dst = append(dst, descriptors.Entry{Key: m.RouteKey, Value: obs.Route})
	}
	for _, hk := range m.Headers {
		for _, h := range obs.Headers {
			if h.Key == hk.Header && h.Value != "" {
				dst = append(dst, descriptors.Entry{Key: hk.Key, Value: h.Value})
				break
			}
		}
	}
	return dst
}

// matchValue reports whether value matches a descriptor pattern: "" matches
// any value, '*' matches any run of characters, anything else is exact.
func matchValue(pattern, value string) bool {
	if pattern == "" {
		return true
	}
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == value
	}
	if !strings.HasPrefix(value, pattern[:star]) {
		return false
	}
	value, pattern = value[star:], pattern[star+1:]
	for {
		star = strings.IndexByte(pattern, '*')
		if star < 0 {
			return strings.HasSuffix(value, pattern)
		}
		i := strings.Index(value, pattern[:star])
		if i < 0 {
			return false
		}
		value, pattern = value[i+star:], pattern[star+1:]
	}
}
