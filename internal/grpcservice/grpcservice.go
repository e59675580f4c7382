// Package grpcservice is the one shape of a gRPC service that Leapgate's
// server hosts: a service package describes itself with a Service (how it
// registers and the policy of its streams), and the server registers every
// Service it is given on one grpc.Server, guarding the streams that ask for
// it, timing every method and recovering its panics. A new service is a
// package that returns a Service, and one line in package server.
//
// The server's codec is Codec: a handler that receives a *RawMessage gets
// the request's bytes undecoded, to decode them its own way (the rate-limit
// service takes strings with invalid UTF-8 as they are, which gRPC's proto
// codec refuses with Internal); every other message is decoded as gRPC's
// proto codec does.
package grpcservice

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// Service is one gRPC service as the server hosts it.
type Service struct {
	// Register registers the service's handlers on r; required.
	Register func(r grpc.ServiceRegistrar)
	// Streams is the policy of the service's streaming methods; the zero
	// value leaves them unbounded.
	Streams StreamPolicy
}

// StreamPolicy bounds the long-lived streams of a service that any client
// can open.
type StreamPolicy struct {
	// Budget names the budget of open streams the service's streams count
	// against: services that name the same budget share it, and the server
	// sets its size (a budget it does not know is a start-up error). ""
	// is no budget: the streams are neither counted nor timed out.
	Budget string
	// Idle ends a stream that has received nothing for this long
	// (DEADLINE_EXCEEDED); 0 never does. Only for a stream with a Budget.
	Idle time.Duration
	// Trusted, when set, admits the streams only from a peer the server
	// trusts (UNAUTHENTICATED otherwise, before the stream counts against
	// its budget): for streams whose messages change shared state, as
	// observations open and close circuit breakers. The server decides who
	// is trusted (docs/operations.md, "Who may call what"). Only for a
	// stream with a Budget.
	Trusted bool
}

// RawMessage is a message that Codec leaves undecoded: Bytes is its wire
// form, which the handler owns.
type RawMessage struct{ Bytes []byte }

// Codec returns gRPC's proto codec, except that it hands a *RawMessage its
// bytes undecoded (grpc.ForceServerCodecV2 makes it the server's).
func Codec() encoding.CodecV2 { return rawCodec{proto: encoding.GetCodecV2("proto")} }

type rawCodec struct{ proto encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*RawMessage); ok {
		w.Bytes = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (c rawCodec) Name() string { return c.proto.Name() }
