package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/leapgate/leapgate/config"
)

// certReloader serves the gRPC listener's TLS configuration, re-reading the
// certificate, key and client CA files whenever one of them changes (size
// or modification time, following symlinks, so Kubernetes Secret mounts
// work). The check runs on each new connection; an unreadable or
// mismatched update is logged and the previous configuration kept, so a
// half-written rotation never breaks the listener.
type certReloader struct {
	certFile, keyFile, caFile, san string
	logger                         *slog.Logger

	mu      sync.Mutex
	stamps  []fileStamp
	current *tls.Config
}

type fileStamp struct {
	size    int64
	modTime time.Time
}

// newCertReloader loads the files once; an error here stops start-up.
func newCertReloader(s config.Settings, logger *slog.Logger) (*certReloader, error) {
	r := &certReloader{
		certFile: s.GRPCServerTLSCert,
		keyFile:  s.GRPCServerTLSKey,
		caFile:   s.GRPCClientTLSCACert,
		san:      s.GRPCClientTLSSAN,
		logger:   logger,
	}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	cfg, err := r.build()
	if err != nil {
		return nil, err
	}
	r.stamps, r.current = stamps, cfg
	return r, nil
}

// serverConfig returns the listener's tls.Config: every handshake asks the
// reloader for the current configuration.
func (r *certReloader) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.config(), nil
		},
	}
}

// config returns the current configuration, reloading it first if a file
// changed.
func (r *certReloader) config() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps, err := r.stat()
	if err != nil {
		r.logger.Error("TLS files unreadable; keeping the previous certificates", "error", err)
		return r.current
	}
	if slices.Equal(stamps, r.stamps) {
		return r.current
	}
	cfg, err := r.build()
	if err != nil {
		// Likely mid-rotation (certificate written, key not yet): the next
		// handshake tries again.
		r.logger.Error("TLS files changed but do not load; keeping the previous certificates", "error", err)
		return r.current
	}
	r.stamps, r.current = stamps, cfg
	r.logger.Info("TLS certificates reloaded", "cert", r.certFile, "client_ca", r.caFile)
	return cfg
}

func (r *certReloader) files() []string {
	files := []string{r.certFile, r.keyFile}
	if r.caFile != "" {
		files = append(files, r.caFile)
	}
	return files
}

func (r *certReloader) stat() ([]fileStamp, error) {
	var stamps []fileStamp
	for _, name := range r.files() {
		fi, err := os.Stat(name)
		if err != nil {
			return nil, fmt.Errorf("TLS file: %w", err)
		}
		stamps = append(stamps, fileStamp{size: fi.Size(), modTime: fi.ModTime()})
	}
	return stamps, nil
}

// build reads the files into a complete server configuration.
func (r *certReloader) build() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading GRPC_SERVER_TLS_CERT %s and GRPC_SERVER_TLS_KEY %s: %w", r.certFile, r.keyFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
	}
	if r.caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(r.caFile)
	if err != nil {
		return nil, fmt.Errorf("reading GRPC_CLIENT_TLS_CACERT: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("GRPC_CLIENT_TLS_CACERT %s holds no PEM certificate", r.caFile)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	if r.san != "" {
		san := r.san
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !hasSAN(cs.PeerCertificates[0], san) {
				return errors.New("client certificate lacks the subject alternative name required by GRPC_CLIENT_TLS_SAN")
			}
			return nil
		}
	}
	return cfg, nil
}

// hasSAN reports whether cert carries san as a DNS name, URI, IP address or
// e-mail address.
func hasSAN(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	if slices.ContainsFunc(cert.URIs, func(u *url.URL) bool { return u.String() == san }) {
		return true
	}
	ip := net.ParseIP(san)
	return ip != nil && slices.ContainsFunc(cert.IPAddresses, ip.Equal)
}
