package service

import (
	"context"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leapgate/leapgate/internal/grpcservice"
)

// GRPC returns the rate-limit service as the server hosts it
// (grpcservice.Service): envoy.service.ratelimit.v3.RateLimitService with
// its own handler, which receives the request's raw bytes
// (grpcservice.RawMessage) and decodes them itself
// (decodeRateLimitRequest): gRPC's proto codec refuses a request with
// invalid UTF-8 in a string field and answers Internal, and any error lets
// Envoy (by default, failure_mode_deny: false) pass the request unlimited.
// Decoding here, a value with invalid UTF-8 is a value like any other, and a
// message that is not protobuf at all is answered InvalidArgument. The
// handler also counts and times every call under envoyproxy/ratelimit's
// metric names. The server must use grpcservice.Codec.
func (s *Service) GRPC() grpcservice.Service {
	desc := grpc.ServiceDesc{
		ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
		HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "ShouldRateLimit",
			Handler:    s.shouldRateLimitHandler,
		}},
		Metadata: rlsv3.RateLimitService_ServiceDesc.Metadata,
	}
	return grpcservice.Service{Register: func(r grpc.ServiceRegistrar) { r.RegisterService(&desc, s) }}
}

// shouldRateLimitHandler is the unary handler of ShouldRateLimit: the
// interceptors see the call before decoding, so that a request that does
// not decode is timed and counted like any other.
func (s *Service) shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(grpcservice.RawMessage)
	if err := dec(in); err != nil {
		return nil, err
	}
	handle := func(ctx context.Context, req any) (any, error) {
		start := time.Now()
		defer func() {
			s.metrics.rlsRequests.Inc()
			s.metrics.rlsDuration.Observe(time.Since(start).Seconds())
		}()
		r, err := decodeRateLimitRequest(req.(*grpcservice.RawMessage).Bytes)
		if err != nil {
			return nil, err
		}
		resp, err := srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, r)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(
				attribute.String("ratelimit.domain", traceValue(r.GetDomain())),
				attribute.Int("ratelimit.descriptors", len(r.GetDescriptors())),
				attribute.String("ratelimit.overall_code", resp.GetOverallCode().String()))
		}
		return resp, err
	}
	if interceptor == nil {
		return handle(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, in, info, handle)
}

// decodeRateLimitRequest decodes a RateLimitRequest from its wire bytes,
// taking strings with invalid UTF-8 as they are (unmarshalLenient). Bytes
// that are not a RateLimitRequest are an InvalidArgument error.
func decodeRateLimitRequest(b []byte) (*rlsv3.RateLimitRequest, error) {
	req := new(rlsv3.RateLimitRequest)
	if err := proto.Unmarshal(b, req); err == nil {
		return req, nil
	}
	// The common case took the fast path; only invalid UTF-8 or a
	// malformed message comes here.
	proto.Reset(req)
	if err := unmarshalLenient(b, req.ProtoReflect()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed RateLimitRequest: %v", err)
	}
	return req, nil
}

// maxTraceValue caps a caller-chosen string in a span attribute.
const maxTraceValue = 256

// traceValue is a caller-chosen string as a span may carry it: valid UTF-8,
// at most maxTraceValue bytes.
func traceValue(v string) string {
	if len(v) > maxTraceValue {
		v = v[:maxTraceValue]
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}
