package server

import (
	"context"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/config"
)

// requestLimits bounds the shape of a RateLimitRequest, so that nothing a
// client sends makes the service allocate without bound.
type requestLimits struct {
	maxDescriptors int
	maxEntries     int
	maxKeyLength   int
	maxValueLength int
}

func newRequestLimits(s config.Settings) requestLimits {
	return requestLimits{
		maxDescriptors: s.MaxDescriptors,
		maxEntries:     s.MaxEntries,
		maxKeyLength:   s.MaxKeyLength,
		maxValueLength: s.MaxValueLength,
	}
}

// check returns an InvalidArgument status naming the first limit req breaks.
func (l requestLimits) check(req *rlsv3.RateLimitRequest) error {
	if n := len(req.GetDomain()); n > l.maxKeyLength {
		return status.Errorf(codes.InvalidArgument, "domain is %d bytes long, more than the limit of %d", n, l.maxKeyLength)
	}
	descs := req.GetDescriptors()
	if len(descs) > l.maxDescriptors {
		return status.Errorf(codes.InvalidArgument, "request has %d descriptors, more than the limit of %d", len(descs), l.maxDescriptors)
	}
	for i, d := range descs {
		entries := d.GetEntries()
		if len(entries) > l.maxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries, more than the limit of %d", i, len(entries), l.maxEntries)
		}
		for j, e := range entries {
			if n := len(e.GetKey()); n > l.maxKeyLength {
				return status.Errorf(codes.InvalidArgument, "descriptor %d entry %d: key is %d bytes long, more than the limit of %d", i, j, n, l.maxKeyLength)
			}
			if n := len(e.GetValue()); n > l.maxValueLength {
				return status.Errorf(codes.InvalidArgument, "descriptor %d entry %d (key %q): value is %d bytes long, more than the limit of %d", i, j, e.GetKey(), n, l.maxValueLength)
			}
		}
	}
	return nil
}

// guardedService checks every request against the limits before handing it
// to the rate-limit service. Both the gRPC listener and /json use it.
type guardedService struct {
	limits requestLimits
	next   rlsv3.RateLimitServiceServer
}

var _ rlsv3.RateLimitServiceServer = guardedService{}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (g guardedService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "empty request")
	}
	if err := g.limits.check(req); err != nil {
		return nil, err
	}
	resp, err := g.next.ShouldRateLimit(ctx, req)
	if err == nil && resp == nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("no response for domain %q", req.GetDomain()))
	}
	return resp, err
}
