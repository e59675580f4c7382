package config

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// XDS holds the settings of the xDS rule source (CONFIG_TYPE=GRPC_XDS_SOTW),
// with envoyproxy/ratelimit's names.
type XDS struct {
	// ConfigType is FILE (the default) or GRPC_XDS_SOTW.
	ConfigType ConfigType `envconfig:"CONFIG_TYPE" default:"FILE"`
	// ServerURL is the management server's address (host:port).
	ServerURL string `envconfig:"CONFIG_GRPC_XDS_SERVER_URL" default:"localhost:18000"`
	// NodeID is the node id this service presents to the management server.
	NodeID string `envconfig:"CONFIG_GRPC_XDS_NODE_ID" default:"default"`
	// NodeMetadata is key=value pairs, comma separated, sent as node metadata.
	NodeMetadata string `envconfig:"CONFIG_GRPC_XDS_NODE_METADATA"`
	// ServerUseTLS turns TLS on towards the management server.
	ServerUseTLS bool `envconfig:"CONFIG_GRPC_XDS_SERVER_USE_TLS" default:"false"`
	// ClientTLSCert and ClientTLSKey are a client certificate and key (PEM)
	// presented to the management server (both or neither).
	ClientTLSCert string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"`
	ClientTLSKey  string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"`
	// ServerTLSCACert is the CA (PEM) that signed the server's certificate;
	// empty uses the system roots.
	ServerTLSCACert string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_CACERT"`
	// ServerTLSSAN, when set, is the name the server certificate must carry.
	ServerTLSSAN string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_SAN"`
	// AdditionalHeaders are sent as gRPC metadata on the ADS stream, as
	// "name:value" pairs, comma separated (envconfig's map syntax, as
	// upstream reads it).
	AdditionalHeaders map[string]string `envconfig:"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"`
	// ConnectRetryInterval is the wait after an attempt that reached no
	// management server, before jitter.
	ConnectRetryInterval time.Duration `envconfig:"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL" default:"3s"`
	// BackoffInitial and BackoffMax bound the exponential delay before
	// re-opening a stream that broke after it had opened.
	BackoffInitial time.Duration `envconfig:"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL" default:"1s"`
	BackoffMax     time.Duration `envconfig:"XDS_CLIENT_BACKOFF_MAX_INTERVAL" default:"60s"`
	// BackoffJitter spreads every wait uniformly over ±BackoffRandomFactor
	// of it, so that replicas do not reconnect in step.
	BackoffJitter       bool    `envconfig:"XDS_CLIENT_BACKOFF_JITTER" default:"true"`
	BackoffRandomFactor float64 `envconfig:"XDS_CLIENT_BACKOFF_RANDOM_FACTOR" default:"0.5"`
	// MaxMsgSize, when positive, is the largest xDS response accepted, in
	// bytes (0: gRPC's default, 4 MiB).
	MaxMsgSize int `envconfig:"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES" default:"0"`
}

// Metadata parses NodeMetadata into a map.
func (x XDS) Metadata() (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(x.NodeMetadata, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_NODE_METADATA: %q is not key=value", pair)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// Validate reports every invalid xDS setting at once.
func (x XDS) Validate() error {
	var errs []error
	switch x.ConfigType {
	case SourceFile:
		return nil
	case SourceXDS:
	default:
		return fmt.Errorf("CONFIG_TYPE: %q is neither %s nor %s", x.ConfigType, SourceFile, SourceXDS)
	}
	if x.ServerURL == "" {
		errs = append(errs, errors.New("CONFIG_GRPC_XDS_SERVER_URL: must be set when CONFIG_TYPE=GRPC_XDS_SOTW"))
	}
	if x.NodeID == "" {
		errs = append(errs, errors.New("CONFIG_GRPC_XDS_NODE_ID: must not be empty"))
	}
	if (x.ClientTLSCert == "") != (x.ClientTLSKey == "") {
		errs = append(errs, errors.New("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY: set both or neither"))
	}
	if x.BackoffInitial <= 0 || x.BackoffMax < x.BackoffInitial {
		errs = append(errs, fmt.Errorf("XDS_CLIENT_BACKOFF_*: need 0 < initial (%v) <= max (%v)", x.BackoffInitial, x.BackoffMax))
	}
	if x.ConnectRetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL: must be positive, got %v", x.ConnectRetryInterval))
	}
	if x.BackoffRandomFactor < 0 || x.BackoffRandomFactor > 1 {
		errs = append(errs, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR: %v is outside [0, 1]", x.BackoffRandomFactor))
	}
	if x.MaxMsgSize < 0 {
		errs = append(errs, fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: must not be negative, got %d", x.MaxMsgSize))
	}
	if _, err := x.Metadata(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
