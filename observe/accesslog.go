package observe

import (
	"errors"
	"io"
	"strings"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
)

// AccessLog implements envoy.service.accesslog.v3.AccessLogService: Envoy's
// http_grpc access logger streams batches of completed HTTP requests, each
// of which becomes one observation for the breakers:
//
//   - Route: common_properties.route_name; Cluster: upstream_cluster;
//     Headers: request.request_headers (additional_request_headers_to_log).
//   - Status: response.response_code.
//   - ResponseTime: time_to_first_upstream_rx_byte, the upstream's time to
//     first byte, which is what max_response_time bounds (it leaves out the
//     client's upload and download and what Envoy's filters added); when
//     absent (no upstream response: timeout, reset, connection failure) the
//     whole duration.
//   - Aborted: no response code, or a flag saying the exchange broke
//     rather than answered: UF (upstream connection failure), UC (upstream
//     connection termination), UR (upstream remote reset), UPE (upstream
//     protocol error), LR (local reset), DC (downstream connection
//     termination) and DR (downstream remote reset); the last two count as
//     in ext_proc, where a client reset is not a fast success.
//
// Entries of requests that never reached the upstream are skipped, so a
// breaker's own refusals do not keep it open: rate limited (RL, which
// includes the 503 of a breaker enforced through the rate-limit filter),
// rate-limit service error (RLSE), fault injected (FI), no route (NR), no
// cluster (NC), unauthorized (UAEX), invalid Envoy request headers (IH),
// downstream protocol error (DPE), overload manager (OM), and
// response_code_details "circuit_breaker_open" (ext_proc blocking mode).
// Intermediate log entries of long streams are skipped too: they are not
// completions. TCP entries are ignored.
type AccessLog struct {
	accesslogv3.UnimplementedAccessLogServiceServer

	reg *breaker.Registry
}

// NewAccessLog returns the access-log handler feeding opts.Registry (Clock
// and After are not used: entries come with their own timings).
func NewAccessLog(opts Options) *AccessLog {
	return &AccessLog{reg: opts.Registry}
}

// StreamAccessLogs consumes one access-log stream until Envoy closes it.
func (a *AccessLog) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
			}
			if s, ok := status.FromError(err); ok && s.Code() == codes.Canceled {
				return nil
			}
			return err
		}
		for _, entry := range msg.GetHttpLogs().GetLogEntry() {
			if obs, ok := accessLogObservation(entry); ok {
				a.reg.Observe(obs)
			}
		}
	}
}

// accessLogObservation maps one HTTP access-log entry to an observation;
// ok is false for entries that must not count (see AccessLog).
func accessLogObservation(e *accesslogdatav3.HTTPAccessLogEntry) (obs breaker.Observation, ok bool) {
	c := e.GetCommonProperties()
	f := c.GetResponseFlags()
	//lint:ignore SA1019 Envoys that still set the deprecated flag send entries that must not count
	if c.GetIntermediateLogEntry() || f.GetRateLimited() || f.GetRateLimitServiceError() || f.GetFaultInjected() ||
		f.GetNoRouteFound() || f.GetNoClusterFound() || f.GetUnauthorizedDetails() != nil ||
		f.GetInvalidEnvoyRequestHeaders() || f.GetDownstreamProtocolError() || f.GetOverloadManager() ||
		e.GetResponse().GetResponseCodeDetails() == CircuitOpenDetails {
		return obs, false
	}
	obs = breaker.Observation{
		Route:     c.GetRouteName(),
		Cluster:   c.GetUpstreamCluster(),
		Status:    int(e.GetResponse().GetResponseCode().GetValue()),
		Source:    breaker.SourceALS,
		RequestID: e.GetRequest().GetRequestId(),
	}
	if ttfb := c.GetTimeToFirstUpstreamRxByte(); ttfb != nil {
		obs.ResponseTime = ttfb.AsDuration()
	} else {
		obs.ResponseTime = c.GetDuration().AsDuration()
	}
	obs.Aborted = obs.Status == 0 || f.GetUpstreamConnectionFailure() || f.GetUpstreamConnectionTermination() ||
		f.GetUpstreamRemoteReset() || f.GetUpstreamProtocolError() || f.GetLocalReset() ||
		f.GetDownstreamConnectionTermination() || f.GetDownstreamRemoteReset()
	for name, value := range e.GetRequest().GetRequestHeaders() {
		obs.Headers = append(obs.Headers, descriptors.Entry{Key: strings.ToLower(name), Value: value})
	}
	return obs, true
}
