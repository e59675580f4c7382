package observe

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/envoyhdr"
	"github.com/leapgate/leapgate/window"
)

// ExtProcFilterName is the key under which Envoy's ext_proc filter sends
// the requested attributes.
const ExtProcFilterName = "envoy.filters.http.ext_proc"

// Attributes read from the ext_proc request (request_attributes in the
// filter configuration); response.code is a fallback for :status.
const (
	AttrRouteName    = "xds.route_name"
	AttrClusterName  = "xds.cluster_name"
	AttrResponseCode = "response.code"
)

// RequestIDHeader is Envoy's request ID header: with it, a request that
// both ext_proc and the access-log service report counts once (see
// breaker.Observation.RequestID).
const RequestIDHeader = "x-request-id"

// CircuitOpenDetails is the response code details of the ImmediateResponse
// sent when a breaker refuses a request in blocking mode.
const CircuitOpenDetails = "circuit_breaker_open"

// ExtProc implements envoy.service.ext_proc.v3.ExternalProcessor: Envoy
// opens one stream per HTTP request and sends its request headers, then its
// response headers, on it. The time between the two on our monotonic clock
// is the request's response time (close to upstream time to first byte),
// fed with the :status to the breakers the request's route, cluster and
// configured headers select (see breaker.Mapping).
//
//   - Observability mode (observability_mode set on the messages): nothing
//     is sent back, and the stream is closed once the response headers are
//     in.
//   - Blocking mode: every message is answered with CONTINUE, except that
//     request headers whose breakers refuse are answered with an
//     ImmediateResponse 503 carrying retry-after (seconds, rounded up) and
//     x-ratelimit-reason: circuit-open.
//
// A stream that ends before response headers (client reset, upstream reset
// Envoy did not turn into a local reply) counts as aborted. A request still
// open past a slow_request_ratio breaker's max_response_time counts as slow
// for that breaker as soon as that time passes, once: its eventual response
// is not counted again by that breaker (other breakers still count it).
// Streams without request headers (request_header_mode SKIP) are not timed
// and count nothing.
type ExtProc struct {
	extprocv3.UnimplementedExternalProcessorServer

	reg     *breaker.Registry
	clock   window.Clock
	after   func(time.Duration) <-chan time.Time
	headers []string // request headers the registry's mapping uses
}

// NewExtProc returns the ext_proc handler feeding opts.Registry.
func NewExtProc(opts Options) *ExtProc {
	registry := opts.Registry
	p := &ExtProc{reg: registry, clock: opts.Clock, after: opts.After}
	if p.clock == nil {
		p.clock = registry.Clock()
	}
	if p.after == nil {
		p.after = time.After
	}
	for _, hk := range registry.Mapping().Headers {
		p.headers = append(p.headers, hk.Header)
	}
	return p
}

type recvResult struct {
	msg *extprocv3.ProcessingRequest
	err error
}

// exchange is the state of one ext_proc stream, i.e. one HTTP request.
type exchange struct {
	p       *ExtProc
	started bool // request headers seen
	done    bool // response headers seen (or refused): nothing more to count
	t0      time.Duration
	obs     breaker.Observation
	targets []breaker.Target
	counted []bool // targets already counted (early slow signal)
	tbuf    [4]breaker.Target
	cbuf    [4]bool
	timer   <-chan time.Time
}

// Process serves one ext_proc stream.
func (p *ExtProc) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	x := &exchange{p: p}
	var msgs chan recvResult // nil until a timer needs a concurrent receiver
	defer func() {
		if x.started && !x.done {
			x.finish(breaker.Observation{Aborted: true})
		}
	}()
	for {
		var msg *extprocv3.ProcessingRequest
		var err error
		if msgs == nil {
			msg, err = stream.Recv()
		} else {
			select {
			case r := <-msgs:
				msg, err = r.msg, r.err
			case <-x.timer:
				x.timer = nil
				x.inFlight()
				continue
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if s, ok := status.FromError(err); ok && s.Code() == codes.Canceled {
				return nil
			}
			return err
		}
		stop, err := x.handle(stream, msg)
		if err != nil || stop {
			return err
		}
		if x.timer != nil && msgs == nil {
			msgs = make(chan recvResult, 1)
			go receive(ctx, stream, msgs)
		}
	}
}

// receive forwards stream messages to msgs until the stream fails or ends
// or ctx is done (the handler returned).
func receive(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, msgs chan<- recvResult) {
	for {
		msg, err := stream.Recv()
		select {
		case msgs <- recvResult{msg, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// handle processes one message; stop ends the stream successfully.
func (x *exchange) handle(stream extprocv3.ExternalProcessor_ProcessServer, msg *extprocv3.ProcessingRequest) (stop bool, err error) {
	observe := msg.GetObservabilityMode()
	var reply *extprocv3.ProcessingResponse
	switch r := msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if !x.started {
			x.start(msg, r.RequestHeaders)
			if !observe {
				ok, wait, probes := x.p.reg.AllowTargets(x.targets)
				if !ok {
					x.done = true // never goes upstream: nothing to observe
					return true, stream.Send(circuitOpenResponse(wait))
				}
				if len(probes) > 0 {
					// This stream is the probe: its outcome is the probe's.
					x.obs.Headers = append(x.obs.Headers, descriptors.Entry{Key: envoyhdr.ProbeHeader, Value: envoyhdr.FormatProbes(probes)})
				}
			}
		}
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if x.started && !x.done {
			x.finish(breaker.Observation{Status: responseStatus(msg, r.ResponseHeaders)})
		}
		if observe {
			return true, nil // nothing more to learn from this request
		}
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	default:
		return true, status.Error(codes.InvalidArgument, "ext_proc: processing request carries no request, headers, body or trailers")
	}
	if observe {
		return false, nil
	}
	return false, stream.Send(reply)
}

// start records the request: t0, its observation identity, its breakers and
// the slow-request timer.
func (x *exchange) start(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	x.started = true
	x.t0 = x.p.clock.Now()
	attrs := msg.GetAttributes()[ExtProcFilterName]
	x.obs.Route = stringAttr(attrs, AttrRouteName)
	x.obs.Cluster = stringAttr(attrs, AttrClusterName)
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case RequestIDHeader:
			x.obs.RequestID = headerValue(hv)
		case envoyhdr.ProbeHeader:
			// The probes the rate-limit answer admitted this request as
			// (the rate-limit filter runs before ext_proc).
			x.obs.Headers = append(x.obs.Headers, descriptors.Entry{Key: envoyhdr.ProbeHeader, Value: headerValue(hv)})
		}
	}
	if len(x.p.headers) > 0 {
		for _, name := range x.p.headers { // the first value of each configured header
			for _, hv := range h.GetHeaders().GetHeaders() {
				if hv.GetKey() == name {
					x.obs.Headers = append(x.obs.Headers, descriptors.Entry{Key: name, Value: headerValue(hv)})
					break
				}
			}
		}
	}
	x.targets = x.p.reg.Targets(x.tbuf[:0], &x.obs)
	x.counted = x.cbuf[:0]
	for range x.targets {
		x.counted = append(x.counted, false)
	}
	x.arm()
}

// arm sets the timer for the earliest max_response_time not yet passed.
func (x *exchange) arm() {
	next := time.Duration(-1)
	for i, t := range x.targets {
		c := t.Breaker().Config()
		if !x.counted[i] && c.Strategy.Timed() && (next < 0 || c.MaxResponseTime < next) {
			next = c.MaxResponseTime
		}
	}
	if next < 0 {
		x.timer = nil
		return
	}
	// Due strictly after max_response_time, as "slow" is strictly above it.
	x.timer = x.p.after(max(next-(x.p.clock.Now()-x.t0), 0) + time.Nanosecond)
}

// inFlight counts the request as slow for every slow_request_ratio breaker
// whose max_response_time it has exceeded, then re-arms the timer.
func (x *exchange) inFlight() {
	if x.done {
		return
	}
	elapsed := x.p.clock.Now() - x.t0
	for i, t := range x.targets {
		c := t.Breaker().Config()
		if !x.counted[i] && c.Strategy.Timed() && elapsed > c.MaxResponseTime {
			x.counted[i] = true
			obs := x.obs
			obs.ResponseTime, obs.InFlight, obs.Source = elapsed, true, breaker.SourceExtProcInFlight
			x.p.reg.ObserveTargets(x.targets[i:i+1], obs)
		}
	}
	x.arm()
}

// finish counts the request's outcome for the breakers that have not
// counted it yet.
func (x *exchange) finish(outcome breaker.Observation) {
	x.done = true
	x.timer = nil
	obs := x.obs
	obs.ResponseTime = x.p.clock.Now() - x.t0
	obs.Status, obs.Aborted, obs.Source = outcome.Status, outcome.Aborted, breaker.SourceExtProc
	remaining := x.targets
	if slices.Contains(x.counted, true) {
		remaining = nil
		for i, t := range x.targets {
			if !x.counted[i] {
				remaining = append(remaining, t)
			}
		}
	}
	x.p.reg.ObserveTargets(remaining, obs)
}

// responseStatus reads :status, falling back to the response.code attribute.
func responseStatus(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) int {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			if code, err := strconv.Atoi(headerValue(hv)); err == nil {
				return code
			}
		}
	}
	if v, ok := msg.GetAttributes()[ExtProcFilterName].GetFields()[AttrResponseCode]; ok {
		switch k := v.GetKind().(type) {
		case *structpb.Value_NumberValue:
			return int(k.NumberValue)
		case *structpb.Value_StringValue:
			if code, err := strconv.Atoi(k.StringValue); err == nil {
				return code
			}
		}
	}
	return 0
}

// headerValue returns a header's value: raw_value, where Envoy puts it, or
// value.
func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

func stringAttr(s *structpb.Struct, name string) string {
	return s.GetFields()[name].GetStringValue()
}

// circuitOpenResponse is the blocking-mode answer to a refused request.
func circuitOpenResponse(wait time.Duration) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			// header names are lower case in HTTP/2 and in Envoy
			{Header: &corev3.HeaderValue{Key: strings.ToLower(envoyhdr.RetryAfterHeader), RawValue: []byte(strconv.FormatInt(envoyhdr.RetryAfter(wait), 10))}},
			{Header: &corev3.HeaderValue{Key: envoyhdr.ReasonHeader, RawValue: []byte(envoyhdr.ReasonCircuitOpen)}},
		}},
		Body:    []byte("circuit breaker open\n"),
		Details: CircuitOpenDetails,
	}}}
}
