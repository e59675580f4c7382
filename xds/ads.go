package xds

import (
	"context"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
)

// adsStream is one state-of-the-world ADS stream subscribed to TypeURL.
// It is go-control-plane's sotw client, keeping what that client hides:
// the type URL of every response, so that a response of another type (an
// empty one would read as "no rules") is refused instead of applied.
type adsStream struct {
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
	// acked is the version of the last response ACKed ("" before any);
	// nonce is the nonce of the last response received.
	acked, nonce string
}

// openADS opens an ADS stream on conn and sends the subscription for
// TypeURL.
func openADS(ctx context.Context, conn grpc.ClientConnInterface, node *corev3.Node) (*adsStream, error) {
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	a := &adsStream{stream: s, node: node}
	return a, a.send("", nil)
}

// recv waits for the next response.
func (a *adsStream) recv() (*discoveryv3.DiscoveryResponse, error) {
	resp, err := a.stream.Recv()
	if err != nil {
		return nil, err
	}
	a.nonce = resp.GetNonce()
	return resp, nil
}

// ack accepts the last response, of the given version.
func (a *adsStream) ack(version string) error {
	a.acked = version
	return a.send(version, nil)
}

// nack refuses the last response with reason; the version stays the last
// one accepted.
func (a *adsStream) nack(reason string) error {
	return a.send(a.acked, &status.Status{Message: reason})
}

func (a *adsStream) send(version string, detail *status.Status) error {
	if err := a.stream.Send(&discoveryv3.DiscoveryRequest{
		Node:          a.node,
		VersionInfo:   version,
		TypeUrl:       TypeURL,
		ResponseNonce: a.nonce,
		ErrorDetail:   detail,
	}); err != nil {
		return fmt.Errorf("sending a discovery request: %w", err)
	}
	return nil
}
