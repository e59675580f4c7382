package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/window"
)

// writeCert writes a certificate of ca for dnsName alone (no IP address:
// a client that checks the host name of 127.0.0.1 must refuse it) and its
// key to dir, returning the two paths.
func writeCert(t *testing.T, ca *TestCA, dir, name, dnsName string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, dnsName, nil, dnsName)
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	for path, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// TestTLS: REDIS_TLS with a CA, a client certificate (Redis requires one by
// default) and REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, against a redis-server
// on a TLS-only port whose certificate names another host.
// TestRedisTLS: the REDIS_TLS* settings against a real redis-server with
// TLS: CA, client certificate, host-name check on and off, missing files.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	ca := NewTestCA(t, "leapgate test CA")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	otherCAFile := filepath.Join(dir, "other-ca.pem")
	if err := os.WriteFile(otherCAFile, NewTestCA(t, "another CA").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	serverCert, serverKey := writeCert(t, ca, dir, "server", "redis.invalid")
	clientCert, clientKey := writeCert(t, ca, dir, "client", "leapgate")

	addr := redistest.StartTLS(t, serverCert, serverKey, caFile).Addr()

	sp, err := window.NewSpec(time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	settings := func() config.Redis {
		r := config.Defaults().Redis
		r.URL = addr
		r.Timeout = 2 * time.Second
		return r
	}
	for _, tc := range []struct {
		name       string
		ca         string
		clientCert bool
		skipHost   bool
		ok         bool
		why        string // in the error
	}{
		{"verified chain, host name skipped", caFile, true, true, true, ""},
		{"host name checked: the certificate names redis.invalid", caFile, true, false, false, "certificate for 127.0.0.1"},
		{"no client certificate", caFile, false, true, false, ""},
		{"unknown CA, even with the host name skipped", otherCAFile, true, true, false, "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := settings()
			st.TLS, st.TLSCACert, st.TLSSkipHostnameVerification = true, tc.ca, tc.skipHost
			if tc.clientCert {
				st.TLSClientCert, st.TLSClientKey = clientCert, clientKey
			}
			opts, err := redisOptions(st)
			if err != nil {
				t.Fatal(err)
			}
			opts.HealthInterval = time.Hour
			s, err := redisstore.New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			res, err := s.Do(context.Background(), []window.Request{{Key: "tls", Spec: sp, Limit: 100, Hits: 1}})
			if tc.ok && (err != nil || !res[0].Recorded) {
				t.Fatalf("want success: %+v %v", res, err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.why)) {
				t.Fatalf("error %v, want one saying %q", err, tc.why)
			}
		})
	}

	// Missing files are construction errors naming the variable.
	st := settings()
	st.TLS, st.TLSCACert = true, filepath.Join(dir, "missing.pem")
	if _, err := redisOptions(st); err == nil || !strings.Contains(err.Error(), "REDIS_TLS_CACERT") {
		t.Fatalf("missing CA file: %v, want an error naming REDIS_TLS_CACERT", err)
	}
}
