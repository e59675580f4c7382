package server

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/leapgate/leapgate/internal/grpcservice"
)

// registerServices registers every service on srv and returns its guarded
// streaming methods: those of a service whose StreamPolicy names one of
// budgets, each budget one streamGuard shared by the services that name
// it. A budget no budget describes is an error. Every method's panic
// counter is created at 0, so that the series alerts read exist from the
// start.
func registerServices(srv *grpc.Server, services []grpcservice.Service, budgets []streamBudget, reg prometheus.Registerer, m *serverMetrics) (map[string]guardedMethod, error) {
	guards := make(map[string]*streamGuard, len(budgets))
	for _, b := range budgets {
		guards[b.name] = newStreamGuard(b, reg)
	}
	streams := make(map[string]guardedMethod)
	for _, svc := range services {
		rec := &recordingRegistrar{ServiceRegistrar: srv}
		svc.Register(rec)
		var guard *streamGuard
		if name := svc.Streams.Budget; name != "" {
			if guard = guards[name]; guard == nil {
				return nil, fmt.Errorf("gRPC service %v: unknown stream budget %q", rec.names(), name)
			}
		}
		for _, d := range rec.descs {
			for _, md := range d.Methods {
				m.panics.WithLabelValues("/" + d.ServiceName + "/" + md.MethodName)
			}
			for _, sd := range d.Streams {
				method := "/" + d.ServiceName + "/" + sd.StreamName
				m.panics.WithLabelValues(method)
				if guard != nil {
					streams[method] = guardedMethod{guard: guard, idle: svc.Streams.Idle, trusted: svc.Streams.Trusted}
				}
			}
		}
	}
	return streams, nil
}

// recordingRegistrar registers services on a grpc.ServiceRegistrar and
// keeps their descriptions.
type recordingRegistrar struct {
	grpc.ServiceRegistrar
	descs []*grpc.ServiceDesc
}

// RegisterService registers impl as desc and records desc.
func (r *recordingRegistrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	r.descs = append(r.descs, desc)
	r.ServiceRegistrar.RegisterService(desc, impl)
}

// names returns the names of the services recorded.
func (r *recordingRegistrar) names() []string {
	var names []string
	for _, d := range r.descs {
		names = append(names, d.ServiceName)
	}
	return names
}
