// Package descriptors loads rate-limit rules in the YAML format of
// envoyproxy/ratelimit and matches request descriptors against them.
//
// A rule file names a domain and a tree of descriptors:
//
//	domain: api
//	descriptors:
//	  - key: user            # value-less: every distinct user has its own counter
//	    rate_limit: {unit: minute, requests_per_unit: 100}
//	  - key: path
//	    value: "/admin*"     # '*' wildcards anywhere in a value
//	    rate_limit: {unit: second, requests_per_unit: 5}
//
// Load reads every *.yaml and *.yml file of a directory tree (dotfiles and
// dot-directories such as Kubernetes' ..data are skipped, symlinks to files
// are followed); LoadFS does the same on an fs.FS and Parse on files in
// memory. Every problem found is reported at once, as an errors.Join of
// *Error values carrying file, line and reason; a Set is returned only when
// there is none.
//
// # Matching
//
// Set.Match walks the tree one level per request entry exactly as
// envoyproxy/ratelimit does: at each level the exact value is tried first,
// then the wildcard values in file order (the first match wins), then the
// value-less key; there is no backtracking. The request must be exactly as
// deep as the rule: the node matched by the last entry is the answer, and a
// node that carries no limit (no rate_limit, rate_limits, unlimited or
// circuit_breaker) is a whitelist entry for which Match returns nil.
//
// # Extensions to the envoyproxy/ratelimit format
//
// These fields are Leapgate's own; the other fields have their upstream
// meaning.
//
//   - rate_limits: a list of rate_limit blocks on one descriptor, beside or
//     instead of rate_limit. Every limit must pass (e.g. 10 per second and
//     1000 per day on the same key).
//   - In a rate_limit block: unit_multiplier (window = unit × multiplier,
//     e.g. 5 minutes); window (a Go duration such as "30s" or "90m" that
//     overrides unit and multiplier; the unit reported to Envoy is then the
//     largest unit that divides it, and a sub-second window reports SECOND);
//     algorithm (sliding_window, the default; token_bucket; fixed_window;
//     sliding_log with requests_per_unit at most window.MaxLogLimit; or
//     time_buckets, with buckets: time buckets per window, which must
//     divide the window length exactly; buckets on any other algorithm is
//     refused).
//   - circuit_breaker: a breaker fed by observed responses of the requests
//     matching the descriptor (see Breaker): strategy slow_request_ratio
//     (needs max_response_time), error_ratio or error_count; threshold (a
//     ratio in (0,1] or a count >= 1); error_statuses; min_requests; window
//     (default 10s) and buckets (default 10; must divide the window);
//     open_duration (default 5s); half_open_probes (default 1); probe_timeout
//     (default open_duration).
//
// Unknown fields are rejected at every level, including inside rate_limit
// and circuit_breaker, so a misspelled field never silently disables a limit.
//
// # Keys
//
// Rule.ID is the rule's path in the style of envoyproxy/ratelimit's stats
// keys ("domain.key_value.key"); it is stable across reloads. Rule.AppendKey
// builds the counter key of one request (the ID plus the request's values,
// so each distinct value of a value-less or wildcard level has its own
// counter unless share_threshold is set), and Rule.MetricKey the stats key
// (the ID, unless detailed_metric or value_to_metric ask for request values).
package descriptors
