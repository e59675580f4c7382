package service

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sampleRequest uses every field of a rate-limit request.
func sampleRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain:     "edge",
		HitsAddend: 3,
		Descriptors: []*rlcommonv3.RateLimitDescriptor{
			{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/a"}}},
			{
				Entries:        []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0.0.1"}},
				Limit:          &rlcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)},
				HitsAddend:     wrapperspb.UInt64(7),
				IsNegativeHits: true,
			},
			{},
		},
	}
}

func TestLenientDecodesInvalidUTF8(t *testing.T) {
	// Field 1 (domain) "d", field 2 (descriptor) holding one entry whose
	// key is "u\xff" and value "\xc0\xaf" (an overlong '/').
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "u\xff")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xc0\xaf")
	desc := protowire.AppendTag(nil, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "d")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, desc)
	msg = protowire.AppendTag(msg, 3, protowire.VarintType)
	msg = protowire.AppendVarint(msg, 4)

	if err := proto.Unmarshal(msg, new(rlsv3.RateLimitRequest)); err == nil {
		t.Fatal("proto.Unmarshal accepted invalid UTF-8; the lenient path is not needed")
	}
	req, err := decodeRateLimitRequest(msg)
	if err != nil {
		t.Fatal(err)
	}
	e := req.GetDescriptors()[0].GetEntries()[0]
	if req.GetDomain() != "d" || e.GetKey() != "u\xff" || e.GetValue() != "\xc0\xaf" || req.GetHitsAddend() != 4 {
		t.Errorf("decoded %q %q %q %d", req.GetDomain(), e.GetKey(), e.GetValue(), req.GetHitsAddend())
	}
}

func TestDecodeRateLimitRequest(t *testing.T) {
	valid, err := proto.Marshal(sampleRequest())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		msg  []byte
		ok   bool
	}{
		{"valid", valid, true},
		{"empty", nil, true},
		{"unknown field kept", protowire.AppendVarint(protowire.AppendTag(append([]byte{}, valid...), 99, protowire.VarintType), 1), true},
		{"truncated", valid[:len(valid)-1], false},
		{"wrong wire type: an unknown field, as in proto", protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1), true},
		{"deeply nested garbage", []byte(strings.Repeat("\x12\x02", 3)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := decodeRateLimitRequest(tt.msg)
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				want := new(rlsv3.RateLimitRequest)
				if err := proto.Unmarshal(tt.msg, want); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(req, want) {
					t.Errorf("decoded %v, want %v", req, want)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want InvalidArgument", err)
			}
		})
	}
}

// FuzzLenientMatchesProto: whatever proto.Unmarshal decodes,
// unmarshalLenient decodes to an equal message; and whatever
// unmarshalLenient decodes, once its strings are made valid UTF-8, proto
// decodes the re-encoded message to the same.
func FuzzLenientMatchesProto(f *testing.F) {
	valid, _ := proto.Marshal(sampleRequest())
	f.Add(valid)
	f.Add([]byte{})
	f.Add([]byte("\x0a\x02\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := new(rlsv3.RateLimitRequest)
		strictErr := proto.Unmarshal(b, want)
		got := new(rlsv3.RateLimitRequest)
		lenientErr := unmarshalLenient(b, got.ProtoReflect())
		if strictErr == nil {
			if lenientErr != nil {
				t.Fatalf("proto decodes %x, lenient fails: %v", b, lenientErr)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%x: lenient %v, proto %v", b, got, want)
			}
			return
		}
		if lenientErr != nil {
			return
		}
		// Lenient succeeded where proto failed: only invalid UTF-8 may be
		// the reason. Making every string valid must satisfy proto.
		fixUTF8(got)
		if _, err := proto.Marshal(got); err != nil {
			t.Fatalf("%x: lenient decoded a message proto cannot encode even with valid strings: %v", b, err)
		}
	})
}

// fixUTF8 replaces invalid UTF-8 in every string of req.
func fixUTF8(req *rlsv3.RateLimitRequest) {
	fix := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
	req.Domain = fix(req.Domain)
	for _, d := range req.Descriptors {
		for _, e := range d.GetEntries() {
			if e != nil {
				e.Key, e.Value = fix(e.Key), fix(e.Value)
			}
		}
	}
}

// nestedValue is the wire bytes of a structpb.Value whose innermost
// message (an empty one) is nested depth messages deep: a Value holds a
// ListValue (field 6) that holds Values (field 1), and so on.
func nestedValue(depth int) []byte {
	var b []byte
	for d := depth; d >= 1; d-- {
		field := protowire.Number(1) // a ListValue's values
		if (d-1)%2 == 0 {
			field = 6 // a Value's list_value
		}
		b = protowire.AppendBytes(protowire.AppendTag(nil, field, protowire.BytesType), b)
	}
	return b
}

// TestLenientDepth: messages nested maxLenientDepth deep decode as
// proto.Unmarshal decodes them; one level more is refused.
func TestLenientDepth(t *testing.T) {
	for _, depth := range []int{1, 2, maxLenientDepth - 1, maxLenientDepth, maxLenientDepth + 1, 3 * maxLenientDepth} {
		t.Run(fmt.Sprint(depth), func(t *testing.T) {
			b := nestedValue(depth)
			want := new(structpb.Value)
			if err := proto.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			got := new(structpb.Value)
			err := unmarshalLenient(b, got.ProtoReflect())
			if depth > maxLenientDepth {
				if !errors.Is(err, errTooDeep) {
					t.Fatalf("depth %d: %v, want errTooDeep", depth, err)
				}
				return
			}
			if err != nil || !proto.Equal(got, want) {
				t.Fatalf("depth %d: %v, %v; want %v", depth, got, err, want)
			}
		})
	}
}
