package server

import (
	"context"
	"crypto/subtle"
	"net"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// bearerMatches reports whether an Authorization value is "Bearer
// <token>": the scheme in any case (RFC 9110 §11.1), the token compared in
// constant time. An empty token matches nothing.
func bearerMatches(authorization, token string) bool {
	scheme, credential, ok := strings.Cut(authorization, " ")
	if !ok || token == "" || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimLeft(credential, " ")), []byte(token)) == 1
}

// peerTrust decides which peers may open the streams of a service whose
// StreamPolicy is Trusted (the feeds that open and close breakers):
//
//   - a peer with a verified client certificate (mutual TLS:
//     GRPC_CLIENT_TLS_CACERT, whose CA and GRPC_CLIENT_TLS_SAN are the
//     allow-list);
//   - with a token (FEED_TOKEN), a stream that carries it as
//     "authorization: Bearer <token>" metadata, and no other: loopback
//     peers too, since behind a sidecar proxy every peer arrives from
//     loopback;
//   - without a token, a peer on a loopback address or a Unix socket (the
//     same host or pod);
//   - with anyPeer (FEED_ALLOW_ANY_PEER), every peer.
type peerTrust struct {
	token   string
	anyPeer bool
}

// check returns nil if the stream of ctx may open, else UNAUTHENTICATED
// naming what would let it.
func (t peerTrust) check(ctx context.Context) error {
	if t.anyPeer {
		return nil
	}
	p, _ := peer.FromContext(ctx)
	if p != nil {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.VerifiedChains) > 0 {
			return nil
		}
	}
	if t.token == "" {
		if p != nil && local(p.Addr) {
			return nil
		}
		return status.Error(codes.Unauthenticated, "this stream feeds circuit breakers: from another host it needs FEED_TOKEN (sent as \"authorization: Bearer <token>\" metadata) or mutual TLS, and this server has no FEED_TOKEN")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if bearerMatches(v, t.token) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "this stream feeds circuit breakers: send FEED_TOKEN as \"authorization: Bearer <token>\" metadata (Envoy: grpc_service initial_metadata)")
}

// describe says, for the start-up log, who may open the streams, mtls
// telling whether the listener verifies client certificates.
func (t peerTrust) describe(mtls bool) string {
	who := "loopback"
	switch {
	case t.anyPeer:
		return "any peer"
	case t.token != "":
		who = "FEED_TOKEN"
	}
	if mtls {
		who += " or mutual TLS"
	}
	return who
}

// local reports whether addr is a loopback or Unix-socket peer.
func local(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.UnixAddr:
		return true
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	}
	return false
}

// peerKey names the peer of ctx for per-peer stream caps: its IP address,
// "unix" for every Unix-socket client.
func peerKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	switch a := p.Addr.(type) {
	case *net.UnixAddr:
		return "unix"
	case *net.TCPAddr:
		return a.IP.String()
	}
	return p.Addr.String()
}
