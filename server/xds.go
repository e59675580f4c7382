package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/xds"
)

// subscribe follows the xDS management server (CONFIG_TYPE=GRPC_XDS_SOTW)
// until ctx is done. Every rule set it sends is checked like a file reload:
// one that does not convert, or that the service or the breakers cannot
// serve, is NACKed with the reason, logged and counted, and the last good
// rules keep serving.
func (l *ruleLoader) subscribe(ctx context.Context, x config.XDS) error {
	dial, err := xdsDialOptions(x)
	if err != nil {
		return err
	}
	metadata, err := x.Metadata()
	if err != nil {
		return err
	}
	var lastRejected string
	err = xds.Subscribe(ctx, xds.Options{
		ServerURL:            x.ServerURL,
		NodeID:               x.NodeID,
		NodeMetadata:         metadata,
		DialOptions:          dial,
		Headers:              x.AdditionalHeaders,
		MaxRecvMsgSize:       x.MaxMsgSize,
		ConnectRetryInterval: x.ConnectRetryInterval,
		BackoffInitial:       x.BackoffInitial,
		BackoffMax:           x.BackoffMax,
		Jitter:               x.BackoffJitter,
		RandomFactor:         x.BackoffRandomFactor,
		Rules:                l.opts,
		// A set the service or the breakers cannot serve is NACKed with
		// the reason, like one that does not convert.
		Apply: func(set *descriptors.Set) error {
			if err := l.sink.CheckRules(set); err != nil {
				return err
			}
			l.apply(set)
			return nil
		},
		// go-control-plane re-sends a NACKed snapshot at once, over and
		// over: a rejection is logged once, and its repeats only counted.
		OnResult: func(err error) {
			switch {
			case err == nil:
				lastRejected = ""
			case err.Error() == lastRejected:
				l.metrics.configError.Inc()
				l.metrics.xdsRepeatedRejections.Inc()
			default:
				lastRejected = err.Error()
				l.reject(err)
			}
		},
		Logger: l.logger,
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// xdsDialOptions returns the transport credentials towards the management
// server: TLS (with an optional client certificate, CA and name check) or
// plain text.
func xdsDialOptions(x config.XDS) ([]grpc.DialOption, error) {
	if !x.ServerUseTLS {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.ServerTLSSAN}
	if x.ServerTLSCACert != "" {
		pem, err := os.ReadFile(x.ServerTLSCACert)
		if err != nil {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT %s holds no PEM certificate", x.ServerTLSCACert)
		}
		cfg.RootCAs = pool
	}
	if x.ClientTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(x.ClientTLSCert, x.ClientTLSKey)
		if err != nil {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, nil
}
