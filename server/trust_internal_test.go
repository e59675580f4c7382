package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestBearerMatches(t *testing.T) {
	for _, tt := range []struct {
		header, token string
		want          bool
	}{
		{"Bearer s3cret", "s3cret", true},
		{"bearer s3cret", "s3cret", true}, // the scheme is case-insensitive
		{"BEARER s3cret", "s3cret", true},
		{"Bearer  s3cret", "s3cret", true},
		{"Bearer s3cret2", "s3cret", false},
		{"Bearer S3CRET", "s3cret", false}, // the token is not
		{"Bearers3cret", "s3cret", false},
		{"Basic s3cret", "s3cret", false},
		{"s3cret", "s3cret", false},
		{"", "s3cret", false},
		{"Bearer ", "", false}, // an empty token matches nothing
	} {
		if got := bearerMatches(tt.header, tt.token); got != tt.want {
			t.Errorf("bearerMatches(%q, %q) = %t, want %t", tt.header, tt.token, got, tt.want)
		}
	}
}

// TestPeerTrust: who may open a Trusted stream, by peer address, mutual
// TLS and token.
func TestPeerTrust(t *testing.T) {
	remote := &net.TCPAddr{IP: net.ParseIP("203.0.113.9"), Port: 40000}
	loopback := &net.TCPAddr{IP: net.ParseIP("127.0.0.6"), Port: 40000} // Istio's inbound passthrough source
	loopback6 := &net.TCPAddr{IP: net.IPv6loopback, Port: 40000}
	unix := &net.UnixAddr{Name: "@", Net: "unix"}
	mtls := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}}
	tlsOnly := credentials.TLSInfo{State: tls.ConnectionState{}}
	ctx := func(addr net.Addr, auth credentials.AuthInfo, authorization ...string) context.Context {
		c := peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: auth})
		for _, a := range authorization {
			c = metadata.NewIncomingContext(c, metadata.Pairs("authorization", a))
		}
		return c
	}
	for _, tt := range []struct {
		name  string
		trust peerTrust
		ctx   context.Context
		want  bool
	}{
		{"no token: a remote peer", peerTrust{}, ctx(remote, nil), false},
		{"no token: a remote peer with some token", peerTrust{}, ctx(remote, nil, "Bearer x"), false},
		{"no token: a remote peer over plain TLS", peerTrust{}, ctx(remote, tlsOnly), false},
		{"no token: loopback", peerTrust{}, ctx(loopback, nil), true},
		{"no token: IPv6 loopback", peerTrust{}, ctx(loopback6, nil), true},
		{"no token: a Unix socket", peerTrust{}, ctx(unix, nil), true},
		{"no token: mutual TLS", peerTrust{}, ctx(remote, mtls), true},
		{"no peer at all", peerTrust{}, context.Background(), false},
		{"token: the right one", peerTrust{token: "t0k"}, ctx(remote, nil, "Bearer t0k"), true},
		{"token: lower-case scheme", peerTrust{token: "t0k"}, ctx(remote, nil, "bearer t0k"), true},
		{"token: a wrong one", peerTrust{token: "t0k"}, ctx(remote, nil, "Bearer t0"), false},
		{"token: none sent", peerTrust{token: "t0k"}, ctx(remote, nil), false},
		{"token: loopback without it (a sidecar's peers)", peerTrust{token: "t0k"}, ctx(loopback, nil), false},
		{"token: loopback with it", peerTrust{token: "t0k"}, ctx(loopback, nil, "Bearer t0k"), true},
		{"token: mutual TLS without it", peerTrust{token: "t0k"}, ctx(remote, mtls), true},
		{"any peer", peerTrust{anyPeer: true}, ctx(remote, nil), true},
	} {
		err := tt.trust.check(tt.ctx)
		if got := err == nil; got != tt.want {
			t.Errorf("%s: check = %v, want trusted %t", tt.name, err, tt.want)
		}
		if err != nil && status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want UNAUTHENTICATED", tt.name, err)
		}
	}
}
