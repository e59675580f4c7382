package observe

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"

	"github.com/leapgate/leapgate/internal/testclock"
)

// fuzzRegistry returns a registry with the ingestion tests' rules and a
// clock that moves 40ms at every reading, so timers and windows turn over.
func fuzzRegistry(f *testing.F) *breaker.Registry {
	f.Helper()
	clock := &testclock.Clock{Tick: 40 * time.Millisecond}
	reg, err := breaker.NewRegistry(breaker.Options{
		Clock:              clock,
		Mapping:            breaker.Mapping{Headers: []breaker.HeaderKey{{Header: "x-user-id", Key: "user"}}},
		MaxBreakersPerRule: 64,
	})
	if err != nil {
		f.Fatal(err)
	}
	set := ruletest.Parse(f, descriptors.Options{}, breakerRules)
	if err := reg.SetRules(set); err != nil {
		f.Fatal(err)
	}
	return reg
}

// splitMessages cuts fuzz bytes into length-prefixed chunks (one length
// byte each).
func splitMessages(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 && len(out) < 16 {
		n := min(int(data[0]), len(data)-1)
		out = append(out, data[1:1+n])
		data = data[1+n:]
	}
	return out
}

// joinMessages is the inverse of splitMessages, for seeds.
func joinMessages(msgs ...proto.Message) []byte {
	var out []byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil || len(b) > 255 {
			panic("seed message too large")
		}
		out = append(out, byte(len(b)))
		out = append(out, b...)
	}
	return out
}

// fakeProcessStream is an in-memory ext_proc stream.
type fakeProcessStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	sent int
}

func (s *fakeProcessStream) Context() context.Context { return s.ctx }

func (s *fakeProcessStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *fakeProcessStream) Send(*extprocv3.ProcessingResponse) error { s.sent++; return nil }

// FuzzExtProc feeds ext_proc streams of arbitrary processing requests
// (decoded from the fuzz bytes) to the handler: it must never panic, and
// answer at most one message per request in blocking mode.
func FuzzExtProc(f *testing.F) {
	f.Add(joinMessages(requestHeaders("checkout", "backend", true), responseHeaders("200", true)))
	f.Add(joinMessages(requestHeaders("", "orders", false), responseHeaders("503", false)))
	f.Add(joinMessages(requestHeaders("", "", true, "x-user-id", "alice")))
	f.Add(joinMessages(responseHeaders("abc", false), requestHeaders("checkout", "backend", false), requestHeaders("checkout", "backend", false)))
	reg := fuzzRegistry(f)
	fired := make(chan time.Time, 1)
	fired <- time.Time{}
	close(fired)
	p := NewExtProc(Options{Registry: reg, After: func(time.Duration) <-chan time.Time { return fired }})
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // as gRPC does when the handler returns
		stream := &fakeProcessStream{ctx: ctx}
		for _, b := range splitMessages(data) {
			m := &extprocv3.ProcessingRequest{}
			if proto.Unmarshal(b, m) == nil {
				stream.msgs = append(stream.msgs, m)
			}
		}
		n := len(stream.msgs)
		_ = p.Process(stream)
		if stream.sent > n {
			t.Errorf("%d replies to %d messages", stream.sent, n)
		}
	})
}

// FuzzAccessLog feeds arbitrary access-log messages to the observation
// mapping and the registry: never a panic.
func FuzzAccessLog(f *testing.F) {
	f.Add(joinMessages(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{
			httpEntry("checkout", "backend", 200, 150*time.Millisecond, time.Second, nil)}}}}))
	reg := fuzzRegistry(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, b := range splitMessages(data) {
			m := &accesslogv3.StreamAccessLogsMessage{}
			if proto.Unmarshal(b, m) != nil {
				continue
			}
			for _, e := range m.GetHttpLogs().GetLogEntry() {
				if obs, ok := accessLogObservation(e); ok {
					reg.Observe(obs)
				}
			}
		}
	})
}

// FuzzReport posts arbitrary bodies to /report: 204, 400 or 413, never a
// panic.
func FuzzReport(f *testing.F) {
	for _, s := range []string{
		`{"resource":"orders","response_time_ms":12.5,"status":200}`,
		`{"route":"checkout","cluster":"backend","response_time":"120ms","error":true}`,
		`{"resource":"orders","headers":{"x-user-id":"alice"},"aborted":true}`,
		`{"resource":"orders","response_time_ms":-1}`,
		`{"status":"200"}`,
	} {
		f.Add([]byte(s))
	}
	h := NewReport(Options{Registry: fuzzRegistry(f)})
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/report", strings.NewReader(string(body))))
		switch rec.Code {
		case http.StatusNoContent, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Errorf("status %d for %q", rec.Code, body)
		}
	})
}
