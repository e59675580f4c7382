package observe

import (
	"context"
	"errors"
	"io"
	"testing"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endingAccessLogStream and endingExtProcStream fail their first Recv
// with err.
type endingAccessLogStream struct {
	accesslogv3.AccessLogService_StreamAccessLogsServer
	err error
}

func (s endingAccessLogStream) Recv() (*accesslogv3.StreamAccessLogsMessage, error) {
	return nil, s.err
}
func (s endingAccessLogStream) Context() context.Context { return context.Background() }

type endingExtProcStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	err error
}

func (s endingExtProcStream) Recv() (*extprocv3.ProcessingRequest, error) { return nil, s.err }
func (s endingExtProcStream) Context() context.Context                    { return context.Background() }

// TestStreamEnds: a stream Envoy cancels (it closes streams that way when
// it shuts down or reconnects) ends the handler without an error; any
// other failure of the stream is returned as it came.
func TestStreamEnds(t *testing.T) {
	e := newBreakerEnv(t)
	unavailable := status.Error(codes.Unavailable, "transport is closing")
	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"cancelled", status.Error(codes.Canceled, "context canceled"), nil},
		{"transport failure", unavailable, unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := NewAccessLog(Options{Registry: e.reg}).StreamAccessLogs(endingAccessLogStream{err: tt.err}); !errors.Is(got, tt.want) {
				t.Errorf("access log: %v, want %v", got, tt.want)
			}
			if got := NewExtProc(Options{Registry: e.reg}).Process(endingExtProcStream{err: tt.err}); !errors.Is(got, tt.want) {
				t.Errorf("ext_proc: %v, want %v", got, tt.want)
			}
		})
	}
	if got := NewExtProc(Options{Registry: e.reg}).Process(endingExtProcStream{err: io.EOF}); got != nil {
		t.Errorf("ext_proc at the end of the stream: %v, want nil", got)
	}
}
