// Package observe turns what Envoy reports about finished requests into
// circuit-breaker observations (breaker.Observation) and hands them to a
// breaker.Registry. It has three feeds, one per file:
//
//   - ExtProc (extproc.go): Envoy's external processing service
//     (envoy.service.ext_proc.v3). In observability mode it times each
//     request from its request headers to its response headers (or to the
//     stream's end or abort); in blocking mode it also answers a request
//     whose breaker is open with an immediate 503 and Retry-After.
//   - AccessLog (accesslog.go): Envoy's gRPC access-log service
//     (envoy.service.accesslog.v3), one observation per HTTP log entry.
//   - Report (report.go): POST /report, one JSON observation per request,
//     for proxies other than Envoy and for tests.
//
// The rate-limit answers (package service) read the same registry: while a
// breaker is open, ShouldRateLimit answers OVER_LIMIT. A request should be
// reported by one feed only: the feeds do not deduplicate.
package observe
