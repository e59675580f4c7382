package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/server"
)

// loopback is the address the TLS tests' certificates carry.
var loopback = []net.IP{net.IPv4(127, 0, 0, 1)}

// writeFile writes data to path and moves its modification time forward, so
// that a rewrite within one clock tick is still seen as a change.
func writeFile(t *testing.T, path string, data []byte, age time.Duration) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Now().Add(age)
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

type tlsFiles struct{ dir, cert, key, ca string }

func newTLSFiles(t *testing.T, ca *server.TestCA, serverName string) tlsFiles {
	dir := t.TempDir()
	f := tlsFiles{dir: dir, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), ca: filepath.Join(dir, "ca.crt")}
	cert, key := ca.Issue(t, serverName, loopback, "leapgate.test")
	writeFile(t, f.cert, cert, 0)
	writeFile(t, f.key, key, 0)
	writeFile(t, f.ca, ca.PEM, 0)
	return f
}

// dialTLS makes one ShouldRateLimit call over a fresh TLS connection and
// returns the server certificate's common name.
func dialTLS(t *testing.T, ts *testServer, roots *x509.CertPool, clientCert *tls.Certificate) (string, error) {
	t.Helper()
	var peerName string
	cfg := &tls.Config{
		RootCAs:    roots,
		ServerName: "leapgate.test",
		VerifyConnection: func(cs tls.ConnectionState) error {
			peerName = cs.PeerCertificates[0].Subject.CommonName
			return nil
		},
	}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	cc, err := grpc.NewClient(ts.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, request("test", []string{"user", "tls"}))
	return peerName, err
}

func pool(ca *server.TestCA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(ca.PEM)
	return p
}

func keyPair(t *testing.T, certPEM, keyPEM []byte) *tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestTLSWithCertificateReload(t *testing.T) {
	ca := server.NewTestCA(t, "test CA")
	files := newTLSFiles(t, ca, "first")
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.GRPCServerUseTLS, s.GRPCServerTLSCert, s.GRPCServerTLSKey = true, files.cert, files.key
	})

	if name, err := dialTLS(t, ts, pool(ca), nil); err != nil || name != "first" {
		t.Fatalf("TLS call: %q %v", name, err)
	}
	// Plain text is refused.
	cc, err := grpc.NewClient(ts.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, request("test", []string{"user", "x"})); err == nil {
		t.Error("plain-text call to a TLS listener succeeded")
	}

	// Half a rotation (new certificate, old key) keeps the old pair serving.
	cert2, key2 := ca.Issue(t, "second", loopback, "leapgate.test")
	writeFile(t, files.cert, cert2, time.Minute)
	if name, err := dialTLS(t, ts, pool(ca), nil); err != nil || name != "first" {
		t.Errorf("mid-rotation: %q %v, want the first certificate still served", name, err)
	}
	// The completed rotation is picked up by the next connection.
	writeFile(t, files.key, key2, 2*time.Minute)
	if name, err := dialTLS(t, ts, pool(ca), nil); err != nil || name != "second" {
		t.Errorf("after rotation: %q %v, want the second certificate", name, err)
	}
}

func TestMutualTLS(t *testing.T) {
	ca := server.NewTestCA(t, "test CA")
	files := newTLSFiles(t, ca, "server")
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.GRPCServerUseTLS, s.GRPCServerTLSCert, s.GRPCServerTLSKey = true, files.cert, files.key
		s.GRPCClientTLSCACert, s.GRPCClientTLSSAN = files.ca, "envoy.mesh"
	})
	other := server.NewTestCA(t, "other CA")
	for _, c := range []struct {
		name   string
		cert   *tls.Certificate
		wantOK bool
	}{
		{"no client certificate", nil, false},
		{"certificate with the required SAN", clientCert(t, ca, "envoy", "envoy.mesh"), true},
		{"certificate without the required SAN", clientCert(t, ca, "intruder", "intruder.mesh"), false},
		{"certificate from another CA", clientCert(t, other, "envoy", "envoy.mesh"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := dialTLS(t, ts, pool(ca), c.cert)
			if (err == nil) != c.wantOK {
				t.Errorf("call error = %v, want success %t", err, c.wantOK)
			}
		})
	}

	// Rotating the client CA takes effect for new connections.
	writeFile(t, files.ca, other.PEM, time.Minute)
	if _, err := dialTLS(t, ts, pool(ca), clientCert(t, other, "envoy", "envoy.mesh")); err != nil {
		t.Errorf("client of the new CA after CA rotation: %v", err)
	}
	if _, err := dialTLS(t, ts, pool(ca), clientCert(t, ca, "envoy", "envoy.mesh")); err == nil {
		t.Error("client of the old CA still accepted after CA rotation")
	}
}

// clientCert issues a client certificate for name with the SAN san.
func clientCert(t *testing.T, ca *server.TestCA, name, san string) *tls.Certificate {
	certPEM, keyPEM := ca.Issue(t, name, loopback, san)
	return keyPair(t, certPEM, keyPEM)
}

func TestTLSBadFilesStopStartUp(t *testing.T) {
	dir := t.TempDir()
	s := settingsFor(filepath.Join(dir, "config"))
	s.GRPCServerUseTLS, s.GRPCServerTLSCert, s.GRPCServerTLSKey = true, filepath.Join(dir, "missing.crt"), filepath.Join(dir, "missing.key")
	if _, err := newServerErr(t, s); err == nil {
		t.Error("server started with missing TLS files")
	}
}
