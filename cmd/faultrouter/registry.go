package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// registryFlags are the flags of the verbs that read or write the
// Confluent wire format through a schema registry.
type registryFlags struct {
	url, user, password    string
	tlsCA, tlsCert, tlsKey string
	wireFormat             string
	reloadGrace            time.Duration
}

// addRegistryFlags registers the schema registry flags; withWire adds
// --wire-format, for the verbs that write records.
func addRegistryFlags(fs *flag.FlagSet, withWire bool) *registryFlags {
	f := &registryFlags{}
	fs.StringVar(&f.url, "registry-url", os.Getenv("FAULTROUTER_REGISTRY_URL"),
		"base URL of a Confluent-compatible schema registry API, e.g. http://registry:8081 (env FAULTROUTER_REGISTRY_URL); records in the Confluent wire format are read through it")
	fs.StringVar(&f.user, "registry-user", os.Getenv("FAULTROUTER_REGISTRY_USER"), "schema registry basic auth user (env FAULTROUTER_REGISTRY_USER)")
	fs.StringVar(&f.password, "registry-password", os.Getenv("FAULTROUTER_REGISTRY_PASSWORD"), "schema registry basic auth password (env FAULTROUTER_REGISTRY_PASSWORD)")
	fs.StringVar(&f.tlsCA, "registry-tls-ca", "", "PEM file of the CA that signed the schema registry's certificate (https URLs)")
	fs.StringVar(&f.tlsCert, "registry-tls-cert", "", "PEM client certificate for mutual TLS with the schema registry")
	fs.StringVar(&f.tlsKey, "registry-tls-key", "", "PEM client key for mutual TLS with the schema registry")
	fs.DurationVar(&f.reloadGrace, "registry-reload-grace", 60*time.Second,
		"for this long after the schema registry last failed to answer, a schema ID it says it does not know is asked again instead of dead-lettering the record: a registry that has just restarted may answer before it has reloaded its schemas (0 believes every not-found)")
	if withWire {
		fs.StringVar(&f.wireFormat, "wire-format", envOr("FAULTROUTER_WIRE_FORMAT", string(registry.SingleObject)),
			"framing of the records written: single-object (Avro's single-object encoding) or confluent (schema registry ID; needs --registry-url) (env FAULTROUTER_WIRE_FORMAT)")
	}
	return f
}

// wire returns the wire format asked for; confluent needs --registry-url.
func (f *registryFlags) wire() (registry.WireFormat, error) {
	if f.wireFormat == "" {
		return registry.SingleObject, nil
	}
	w, err := registry.ParseWireFormat(f.wireFormat)
	if err != nil {
		return "", err
	}
	if w == registry.Confluent && f.url == "" {
		return "", fmt.Errorf("--wire-format confluent: needs --registry-url")
	}
	return w, nil
}

// client returns the registry client, nil without --registry-url.
func (f *registryFlags) client(c *codec.Codec) (*registry.Client, error) {
	if f.url == "" {
		return nil, nil
	}
	if f.reloadGrace < 0 {
		return nil, fmt.Errorf("--registry-reload-grace: must be >= 0, got %s", f.reloadGrace)
	}
	cfg := registry.Config{URL: f.url, Username: f.user, Password: f.password, ReloadGrace: f.reloadGrace}
	if f.reloadGrace == 0 {
		cfg.ReloadGrace = -1
	}
	if f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if f.tlsCA != "" {
			pem, err := os.ReadFile(f.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--registry-tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--registry-tls-ca %s: no PEM certificate found", f.tlsCA)
			}
			tc.RootCAs = pool
		}
		if f.tlsCert != "" || f.tlsKey != "" {
			cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--registry-tls-cert/--registry-tls-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cfg.TLS = tc
	}
	r, err := registry.New(cfg, c)
	if err != nil {
		return nil, fmt.Errorf("--registry-url: %w", err)
	}
	return r, nil
}

// reading returns c reading the Confluent wire format too when
// --registry-url is set.
func (f *registryFlags) reading(c *codec.Codec) (*codec.Codec, error) {
	src, err := f.schemas()
	if err != nil || src == nil {
		return c, err
	}
	return c.WithSchemas(src), nil
}

// schemas is the registry as a codec.SchemaSource; nil without
// --registry-url.
func (f *registryFlags) schemas() (codec.SchemaSource, error) {
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	reg, err := f.client(c)
	if err != nil || reg == nil {
		return nil, err
	}
	return reg, nil
}

// framer registers the current schema of the named record under the
// topic's subject (as Confluent's serializers do by default) and returns the
// function that frames a record of it for the Confluent wire format.
func (f *registryFlags) framer(ctx context.Context, c *codec.Codec, topic, record string) (func(string, []byte) []byte, error) {
	reg, err := f.client(c)
	if err != nil {
		return nil, err
	}
	cur, err := avro.Current(record)
	if err != nil {
		return nil, err
	}
	fr, err := reg.Framer(ctx, []registry.TopicSchema{{Topic: topic, Schema: cur.JSON}}, true)
	if err != nil {
		return nil, err
	}
	return fr.Frame, nil
}
