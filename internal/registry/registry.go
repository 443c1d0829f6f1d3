// Package registry connects faultrouter to a schema registry that serves
// the Confluent Schema Registry API (Confluent's, or Apicurio Registry's
// Confluent-compatible API), so that records in the Confluent wire format
// (the byte 0x00, a 4-byte schema ID, the Avro body) are read and written
// beside Avro's single-object encoding.
//
// Reading: a record in the Confluent format is turned into the
// single-object encoding the rest of faultrouter reads (Normalize). Its
// writer schema is fetched by ID once and cached; a schema with the
// canonical form of one of faultrouter's own keeps its body byte for byte,
// any other is resolved against faultrouter's reader schema by the Avro
// rules. An ID the registry does not know, or a schema that does not
// resolve, is the record's fault (a codec error, for the dead-letter
// topic); a registry that does not answer is not (ErrUnavailable: the
// caller waits and tries again).
//
// Writing: a Framer rewrites faultrouter's single-object records into the
// Confluent format with the ID of their schema under the topic's subject,
// by TopicNameStrategy: "<topic>-value".
package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// ErrUnavailable is returned when the registry does not answer, answers
// with a server error, or refuses the credentials: nothing about the record
// at hand, which is to be read again once the registry answers.
var ErrUnavailable = errors.New("registry: schema registry unavailable")

// WireFormat is how records are framed on the wire.
type WireFormat string

const (
	// SingleObject is Avro's single-object encoding (C3 01, an 8-byte
	// CRC-64-AVRO fingerprint, the body): needs no registry.
	SingleObject WireFormat = "single-object"
	// Confluent is the Confluent wire format (00, a 4-byte registry schema
	// ID, the body): needs a registry.
	Confluent WireFormat = "confluent"
)

// ParseWireFormat parses the value of --wire-format.
func ParseWireFormat(s string) (WireFormat, error) {
	switch WireFormat(s) {
	case SingleObject, Confluent:
		return WireFormat(s), nil
	}
	return "", fmt.Errorf("--wire-format: %q is not one of single-object, confluent", s)
}

// Config says how to reach the registry.
type Config struct {
	// URL is the base URL of the Confluent-compatible API, e.g.
	// http://registry:8081 (Confluent) or
	// http://registry:8080/apis/ccompat/v7 (Apicurio). Required.
	URL string
	// Username and Password are sent as HTTP basic auth when Username is
	// set.
	Username, Password string
	// TLS is the client's TLS configuration for an https URL; nil uses the
	// system's roots.
	TLS *tls.Config
	// Timeout bounds one request. Default 10s.
	Timeout time.Duration
	// NotFoundTTL is how long an ID the registry does not know is
	// remembered as unknown, so that a flood of records with a bad ID costs
	// one request per ID and period. Default 30s.
	NotFoundTTL time.Duration
	// ReloadGrace is how long after the registry last failed to answer a
	// "not found" for a schema ID is not believed: a registry that has just
	// restarted answers before it has reloaded its schemas (Apicurio's
	// kafkasql storage replays its journal topic; a Confluent follower
	// catches up with its _schemas topic), and a record whose ID the
	// producer got from it moments ago is not the record's fault. Within
	// the grace such an answer is ErrUnavailable: routing waits and asks
	// again. Outside it, and before any outage, an unknown ID is the
	// record's (codec.ErrUnknownSchema). Default 60s; negative turns it off.
	ReloadGrace time.Duration
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	if c.URL == "" {
		return errors.New("registry: URL: required (--registry-url)")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("registry: URL: %q is not an http:// or https:// URL", c.URL)
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("registry: Username: required with a password (--registry-user)")
	}
	if c.Timeout < 0 {
		return fmt.Errorf("registry: Timeout: must be >= 0, got %s", c.Timeout)
	}
	if c.NotFoundTTL < 0 {
		return fmt.Errorf("registry: NotFoundTTL: must be >= 0, got %s", c.NotFoundTTL)
	}
	return nil
}

// Client reads and registers schemas. It is safe for concurrent use.
type Client struct {
	cfg   Config
	cl    *sr.Client
	codec *codec.Codec

	mu      sync.Mutex
	schemas map[uint32]*entry // writer schemas by ID
	unknown int               // entries of schemas without a Foreign
	trouble time.Time         // when the registry last failed to answer, for ReloadGrace
}

// entry is a schema ID's outcome: its Foreign, or the record error every
// record with the ID gets.
type entry struct {
	f   *codec.Foreign
	err error
	at  time.Time // when err was learnt, for NotFoundTTL
}

// New returns a Client of the registry at cfg.URL; it makes no request.
func New(cfg Config, c *codec.Codec) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.NotFoundTTL == 0 {
		cfg.NotFoundTTL = 30 * time.Second
	}
	if cfg.ReloadGrace == 0 {
		cfg.ReloadGrace = 60 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS != nil {
		tr.TLSClientConfig = cfg.TLS
	}
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.HTTPClient(&http.Client{Transport: tr, Timeout: cfg.Timeout}),
		sr.UserAgent("faultrouter")}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return &Client{cfg: cfg, cl: cl, codec: c, schemas: map[uint32]*entry{}}, nil
}

// URL is the registry's base URL.
func (r *Client) URL() string { return r.cfg.URL }

// Subject is the subject of a topic's record values: TopicNameStrategy.
func Subject(topic string) string { return topic + "-value" }

// Normalize returns v as a single-object encoding: v itself when it is not
// in the Confluent wire format, else the record rewritten (appended to dst)
// with the writer schema its ID names. The error is ErrUnavailable (wrapped)
// when the registry cannot be asked, and otherwise a codec error for the
// dead-letter topic: an ID the registry does not know (codec.ErrUnknownSchema),
// a schema that does not resolve (codec.ErrUnresolvableSchema), a body that
// does not decode (codec.ErrMalformed).
func (r *Client) Normalize(ctx context.Context, dst, v []byte) ([]byte, error) {
	id, ok := codec.ConfluentID(v)
	if !ok {
		return v, nil
	}
	f, err := r.writerSchema(ctx, id)
	if err != nil {
		return nil, err
	}
	return f.SingleObject(dst, v[codec.ConfluentHeaderLen:])
}

// writerSchema returns the resolved writer schema of id, asking the
// registry once.
func (r *Client) writerSchema(ctx context.Context, id uint32) (*codec.Foreign, error) {
	r.mu.Lock()
	e, ok := r.schemas[id]
	r.mu.Unlock()
	if ok && (e.f != nil || time.Since(e.at) < r.cfg.NotFoundTTL || !errors.Is(e.err, codec.ErrUnknownSchema)) {
		return e.f, e.err
	}
	s, err := r.cl.SchemaByID(ctx, int(id))
	e = &entry{at: time.Now()}
	switch {
	case err == nil && s.Type != sr.TypeAvro:
		e.err = fmt.Errorf("%w: registry schema ID %d is a %s schema, not Avro", codec.ErrUnresolvableSchema, id, s.Type)
	case err == nil:
		text := s.Schema
		if len(s.References) > 0 {
			if text, err = r.inlineReferences(ctx, s); errors.Is(err, ErrUnavailable) {
				return nil, err
			}
		}
		if err == nil {
			e.f, err = r.codec.Foreign(text)
		}
		if err != nil {
			e.err = fmt.Errorf("registry schema ID %d: %w", id, err)
		}
	case notFound(err) && r.reloading():
		return nil, fmt.Errorf("%w: registry schema ID %d: not found, within %s of the registry's last failure to answer (it may still be reloading its schemas); asking again",
			ErrUnavailable, id, r.cfg.ReloadGrace)
	case notFound(err):
		e.err = fmt.Errorf("%w: registry schema ID %d: the registry does not know it", codec.ErrUnknownSchema, id)
	default:
		r.troubled()
		return nil, unavailable(err)
	}
	r.mu.Lock()
	if e.f == nil {
		if r.unknown++; r.unknown > maxUnknown {
			// records with ever new IDs must not grow the cache without
			// bound: forget the IDs learnt to be bad
			for k, old := range r.schemas {
				if old.f == nil {
					delete(r.schemas, k)
				}
			}
			r.unknown = 1
		}
	}
	r.schemas[id] = e
	r.mu.Unlock()
	return e.f, e.err
}

// troubled records that the registry failed to answer just now.
func (r *Client) troubled() {
	r.mu.Lock()
	r.trouble = time.Now()
	r.mu.Unlock()
}

// reloading tells whether a "not found" falls within ReloadGrace of the
// registry's last failure to answer.
func (r *Client) reloading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.ReloadGrace > 0 && !r.trouble.IsZero() && time.Since(r.trouble) < r.cfg.ReloadGrace
}

// maxUnknown bounds the IDs remembered as bad (unknown or unresolvable).
const maxUnknown = 4096

// notFound tells whether err is the registry's answer that a schema or
// subject does not exist.
func notFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound
}

func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// WriterSchema is the resolved writer schema of a registry ID, for
// codec.Codec.WithSchemas: a request to the registry, bounded by Timeout,
// the first time an ID is seen.
func (r *Client) WriterSchema(id uint32) (*codec.Foreign, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	return r.writerSchema(ctx, id)
}
