package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// globals are the flags every Kafka-facing verb shares.
type globals struct {
	brokers       string
	prefix        string
	saslMechanism string
	saslUser      string
	saslPassword  string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	logFormat     string
	logLevel      string
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// newFlagSet returns a flag set for a verb with the global flags registered.
func newFlagSet(name, synopsis string, stderr io.Writer) (*flag.FlagSet, *globals) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	g := &globals{}
	fs.StringVar(&g.brokers, "brokers", envOr("FAULTROUTER_BROKERS", "localhost:9092"), "comma-separated seed brokers (env FAULTROUTER_BROKERS)")
	fs.StringVar(&g.prefix, "topic-prefix", os.Getenv("FAULTROUTER_TOPIC_PREFIX"), "prefix of every topic name (env FAULTROUTER_TOPIC_PREFIX)")
	fs.StringVar(&g.saslMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	fs.StringVar(&g.saslUser, "sasl-user", os.Getenv("FAULTROUTER_SASL_USER"), "SASL user (env FAULTROUTER_SASL_USER)")
	fs.StringVar(&g.saslPassword, "sasl-password", os.Getenv("FAULTROUTER_SASL_PASSWORD"), "SASL password (env FAULTROUTER_SASL_PASSWORD)")
	fs.BoolVar(&g.tls, "tls", false, "connect with TLS")
	fs.StringVar(&g.tlsCA, "tls-ca", "", "PEM file of the CA that signed the brokers' certificates (implies --tls)")
	fs.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate for mutual TLS (implies --tls)")
	fs.StringVar(&g.tlsKey, "tls-key", "", "PEM client key for mutual TLS")
	fs.StringVar(&g.logFormat, "log-format", envOr("FAULTROUTER_LOG_FORMAT", "text"), "log format: text ([TASK:<id>] first) or json")
	fs.StringVar(&g.logLevel, "log-level", envOr("FAULTROUTER_LOG_LEVEL", "info"), "log level: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, g
}

// logger builds the logger the flags ask for, writing to w.
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	return logging.New(w, logging.Format(g.logFormat), g.logLevel)
}

// topics loads the topic specs with the prefix applied.
func (g *globals) topics() (topicspec.Set, error) { return topicspec.Load(g.prefix) }

// topicName returns the full name of a topic given by its short name.
func (g *globals) topicName(short topicspec.Short) (string, error) {
	set, err := g.topics()
	if err != nil {
		return "", err
	}
	return set.Name(short)
}

// clientOpts returns the franz-go options reaching the cluster.
func (g *globals) clientOpts(log *slog.Logger) ([]kgo.Opt, error) {
	var seeds []string
	for _, b := range strings.Split(g.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			seeds = append(seeds, b)
		}
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("--brokers: at least one host:port is required")
	}
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...)}
	if log != nil {
		opts = append(opts, kgo.WithLogger(kslog.New(log.With("component", "kafka"))))
	}
	switch strings.ToUpper(g.saslMechanism) {
	case "":
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: g.saslUser, Pass: g.saslPassword}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: g.saslUser, Pass: g.saslPassword}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: g.saslUser, Pass: g.saslPassword}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("--sasl-mechanism %q: allowed PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", g.saslMechanism)
	}
	if g.tls || g.tlsCA != "" || g.tlsCert != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if g.tlsCA != "" {
			pem, err := os.ReadFile(g.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s: no PEM certificate found", g.tlsCA)
			}
			cfg.RootCAs = pool
		}
		if g.tlsCert != "" || g.tlsKey != "" {
			cert, err := tls.LoadX509KeyPair(g.tlsCert, g.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	return opts, nil
}

// client returns a franz-go client for the flags, with extra options.
func (g *globals) client(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := g.clientOpts(nil)
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, extra...)...)
}

// ctxErr hides the error of a verb stopped by a signal.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
