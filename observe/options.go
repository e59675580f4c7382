package observe

import (
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/internal/grpcservice"
	"github.com/leapgate/leapgate/window"
)

// Options are what the feeds need; each constructor reads the fields it
// uses. Registry is required.
type Options struct {
	// Registry receives the observations.
	Registry *breaker.Registry
	// Clock times ext_proc requests; if nil, the Registry's clock.
	Clock window.Clock
	// After returns a channel that receives once d has passed: the timer
	// that notices an ext_proc request still waiting past its breaker's
	// max_response_time; if nil, time.After. With Clock it lets the
	// timing be driven without sleeping.
	After func(d time.Duration) <-chan time.Time
	// StreamIdle ends an ext_proc or access-log stream that has sent
	// nothing for so long (OBSERVATION_STREAM_IDLE_TIMEOUT); 0 never does.
	// The server enforces it (grpcservice.StreamPolicy).
	StreamIdle time.Duration
}

// StreamBudget is the stream budget (grpcservice.StreamPolicy.Budget) that
// the ext_proc and access-log streams share: any client can open them, so
// the server bounds how many are open at once (MAX_OBSERVATION_STREAMS).
const StreamBudget = "observation"

// ExtProcService returns NewExtProc(opts) as the server hosts it:
// envoy.service.ext_proc.v3.ExternalProcessor, its streams under
// StreamBudget and opts.StreamIdle, open only to trusted peers (they feed
// the breakers).
func ExtProcService(opts Options) grpcservice.Service {
	p := NewExtProc(opts)
	return grpcservice.Service{
		Register: func(r grpc.ServiceRegistrar) { extprocv3.RegisterExternalProcessorServer(r, p) },
		Streams:  grpcservice.StreamPolicy{Budget: StreamBudget, Idle: opts.StreamIdle, Trusted: true},
	}
}

// AccessLogService returns NewAccessLog(opts) as the server hosts it:
// envoy.service.accesslog.v3.AccessLogService, its streams under
// StreamBudget and opts.StreamIdle, open only to trusted peers (they feed
// the breakers).
func AccessLogService(opts Options) grpcservice.Service {
	a := NewAccessLog(opts)
	return grpcservice.Service{
		Register: func(r grpc.ServiceRegistrar) { accesslogv3.RegisterAccessLogServiceServer(r, a) },
		Streams:  grpcservice.StreamPolicy{Budget: StreamBudget, Idle: opts.StreamIdle, Trusted: true},
	}
}
