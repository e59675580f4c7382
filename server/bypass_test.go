package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leapgate/leapgate/config"
)

// The tests of this file are the attacks of issue 13 §1: a client that
// controls one descriptor (say, the x-user-id header) tries to make the
// whole request an error, which Envoy (failure_mode_deny: false, its
// default) lets through unlimited. They speak raw gRPC with the exact bytes
// such a client could make Envoy send, invalid UTF-8 included, which no
// protobuf library would encode.

// rawCodec sends and receives messages as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// rawCall sends msg as a ShouldRateLimit request and decodes the answer.
func rawCall(t *testing.T, cc *grpc.ClientConn, msg []byte) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	var out []byte
	err := cc.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &msg, &out, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return nil, err
	}
	resp := new(rlsv3.RateLimitResponse)
	if err := proto.Unmarshal(out, resp); err != nil {
		t.Fatalf("decoding the response: %v", err)
	}
	return resp, nil
}

// Wire builders: a request is field 1 (domain) and fields 2 (descriptors);
// a descriptor is fields 1 (entries); an entry is fields 1 (key), 2 (value).
func wireBytes(dst []byte, num protowire.Number, b []byte) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendBytes(dst, b)
}

func wireEntry(key, value string) []byte {
	return wireBytes(wireBytes(nil, 1, []byte(key)), 2, []byte(value))
}

func wireDescriptor(entries ...[]byte) []byte {
	var d []byte
	for _, e := range entries {
		d = wireBytes(d, 1, e)
	}
	return d
}

func wireRequest(domain string, descriptors ...[]byte) []byte {
	r := wireBytes(nil, 1, []byte(domain))
	for _, d := range descriptors {
		r = wireBytes(r, 2, d)
	}
	return r
}

// TestOneOddDescriptorLiftsNoLimit: mallory has used up her limit; adding a
// second descriptor that is odd in any way must leave the request
// OVER_LIMIT, with the odd descriptor answered on its own.
func TestOneOddDescriptorLiftsNoLimit(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	cc := ts.conn(t)
	mallory := wireDescriptor(wireEntry("user", "mallory"))
	for range 2 { // the limit is 2 a minute
		if resp, err := rawCall(t, cc, wireRequest("test", mallory)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("within the limit: %v %v", resp, err)
		}
	}
	seventeen := make([][]byte, 17)
	for i := range seventeen {
		seventeen[i] = wireEntry("user", "x")
	}
	for _, c := range []struct {
		name    string
		odd     []byte
		limited bool // the odd descriptor has a limit of its own
	}{
		{"8 KiB value", wireDescriptor(wireEntry("user", strings.Repeat("v", 8<<10))), true},
		{"512 KiB value", wireDescriptor(wireEntry("user", strings.Repeat("v", 512<<10))), true},
		{"no entries", wireDescriptor(), false},
		{"empty key", wireDescriptor(wireEntry("", "v")), false},
		{"17 entries", wireDescriptor(seventeen...), false},
		{"invalid UTF-8 value", wireDescriptor(wireEntry("user", "\xff\xfe\xc0")), true},
		{"invalid UTF-8 key", wireDescriptor(wireEntry("us\xffer", "v")), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, err := rawCall(t, cc, wireRequest("test", mallory, c.odd))
			if err != nil {
				t.Fatalf("answered with an error, which Envoy lets through: %v", err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 2 ||
				resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("mallory's limit was lifted: %v", resp)
			}
			odd := resp.Statuses[1]
			if odd.Code != rlsv3.RateLimitResponse_OK || (odd.CurrentLimit != nil) != c.limited {
				t.Errorf("odd descriptor answered %v, want OK with limit=%v", odd, c.limited)
			}
		})
	}

	// An odd value is limited like any other: the third call is over.
	for _, value := range []string{"\xff\xfe\xc0", strings.Repeat("w", 8<<10)} {
		var last *rlsv3.RateLimitResponse
		for range 3 {
			resp, err := rawCall(t, cc, wireRequest("test", wireDescriptor(wireEntry("user", value))))
			if err != nil {
				t.Fatal(err)
			}
			last = resp
		}
		if last.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("third call of a %d-byte odd value: %v, want OVER_LIMIT", len(value), last.OverallCode)
		}
	}
	// Invalid UTF-8 in the domain is just an unknown domain.
	if resp, err := rawCall(t, cc, wireRequest("te\xffst", mallory)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("invalid UTF-8 domain: %v %v, want OK (unknown domain)", resp, err)
	}
}

func TestRequestLevelLimits(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.MaxDescriptors = 2
		s.MaxRequestBytes = 4096
	})
	cc := ts.conn(t)
	d := wireDescriptor(wireEntry("user", "a"))
	if resp, err := rawCall(t, cc, wireRequest("test", d, d)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("at MAX_DESCRIPTORS_PER_REQUEST: %v %v", resp, err)
	}
	resp, err := rawCall(t, cc, wireRequest("test", d, d, d))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 3 {
		t.Errorf("over MAX_DESCRIPTORS_PER_REQUEST: %v %v, want OVER_LIMIT for all 3", resp, err)
	}
	if got := metricValue(t, ts, `leapgate_requests_refused_total{reason="too_many_descriptors"}`); got != "1" {
		t.Errorf("too_many_descriptors counted %q times, want 1", got)
	}
	// Over MAX_REQUEST_BYTES gRPC refuses the message before decoding:
	// Envoy cannot build such a request from headers (its limit is 60 KiB
	// by default and this bound 1 MiB); failure_mode_deny: true denies it.
	big := wireRequest("test", wireDescriptor(wireEntry("user", strings.Repeat("x", 5000))))
	if _, err := rawCall(t, cc, big); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("message over MAX_REQUEST_BYTES: %v, want ResourceExhausted", err)
	}
}

func TestMalformedRequestIsInvalidArgument(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	cc := ts.conn(t)
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"truncated length", []byte{0x0a, 0x10, 't'}},
		{"bad wire type", []byte{0x0f}},
		{"descriptor that is not a message", wireRequest("test", []byte{0x0a, 0xff})},
		{"field number zero", []byte{0x02, 0x00}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := rawCall(t, cc, c.msg); status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want InvalidArgument", err)
			}
		})
	}
}

func TestJSONOddValues(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	body := func(value string) string {
		return `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"mallory"}]},{"entries":[{"key":"user","value":"` + value + `"}]}]}`
	}
	for range 2 {
		post(t, ts.httpURL("/json"), `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"mallory"}]}]}`)
	}
	for _, v := range []string{"\xff\xfe", strings.Repeat("v", 8<<10)} {
		if code, out := post(t, ts.httpURL("/json"), body(v)); code != http.StatusTooManyRequests {
			t.Errorf("/json with a %d-byte odd value: %d %s, want 429", len(v), code, out)
		}
	}
	// A lone surrogate escape is not a character; proto3 JSON refuses it.
	// The caller gets 400, never a 200.
	if code, _ := post(t, ts.httpURL("/json"), body(`\udc00`)); code != http.StatusBadRequest {
		t.Errorf("/json with a lone surrogate: %d, want 400", code)
	}
}
