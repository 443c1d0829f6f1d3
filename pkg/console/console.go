// Package console is the operator console: a web UI over one router
// deployment for reviewers and on-call engineers. It serves the review queue
// (approve, reject, bulk decisions), a task's timeline, the circuit
// breakers (reset), the dead letters (browse and re-drive, as a job) and a
// live feed of the alerts topic.
//
// It reads: a view in its own Pebble directory (view.go), built from the
// committed review, decisions, audit, retry, alerts and dead-letter topics
// (ingest.go, read_committed); the view is a cache, rebuilt from the topics
// when the directory is empty, and replicas run side by side, each with its
// own. It writes only to Kafka, through pkg/control as the CLI does: review
// decisions, breaker resets, re-drives. An item closes when the router's
// audit record for the decision appears, not when the button is pressed. A
// second decision on an item is refused once this replica has sent or read
// the first; should two replicas take two decisions within the moment before
// each reads the other's, the router applies the first and audits the
// second as review.no_open_item, changing nothing.
//
// The breakers page counts the due retries a breaker holds from the audit
// and retry topics: retries the router audited, whose due time has passed,
// and which it has not published.
//
// People sign in with a users file (bcrypt) or behind a trusted reverse
// proxy (auth.go); every state-changing request carries a CSRF token. Pages
// are server-rendered (html/template), in English or Chinese by the
// browser's Accept-Language (i18n.go); every asset is embedded. Live
// updates are server-sent events (events.go).
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config configures the console.
type Config struct {
	// Listen is the HTTP address, e.g. ":8080".
	Listen string
	// Schemas reads records in the Confluent wire format (a schema
	// registry, package registry); nil: only the single-object encoding.
	Schemas codec.SchemaSource
	// StateDir is the Pebble directory of the view (a cache).
	StateDir string
	// Kafka are the franz-go options that reach the cluster.
	Kafka []kgo.Opt
	// Topics are the topic names, prefix applied.
	Topics topicspec.Set
	// Users is the users file; nil only with TrustProxy.
	Users *Users
	// TrustProxy takes the person from X-Forwarded-User / X-Forwarded-Email.
	// Only behind a proxy that sets them and strips them from clients.
	TrustProxy bool
	// ProxyRole is the role of a proxy-identified person missing from the
	// users file: viewer (the default), reviewer or operator.
	ProxyRole string
	// Secret signs sessions and CSRF tokens; replicas behind one address
	// share it. Random when empty (sessions end with the process).
	Secret []byte
	// Policy words the end-user message of a reject and gives the breaker
	// cooldowns; the default policy when nil. Use the router's policy file.
	Policy *policy.Policy
	// MaxRedrives is the re-drive loop guard (default 3, as replay).
	MaxRedrives int
	// RedriveRate is the default records per second of a re-drive job
	// (default 50).
	RedriveRate int
	// Log is the logger (slog.Default() when nil).
	Log *slog.Logger
}

// Validate checks the config and fills the defaults.
func (c *Config) Validate() error {
	switch {
	case c.Listen == "":
		return errors.New("console: Listen: required, e.g. :8080")
	case c.StateDir == "":
		return errors.New("console: StateDir: required")
	case len(c.Kafka) == 0:
		return errors.New("console: Kafka: the client options are required")
	case c.Users == nil && !c.TrustProxy:
		return errors.New("console: nothing may be served without authentication: give a users file (--users) or trust a proxy header (--trust-proxy-header)")
	}
	if err := c.Topics.Validate(); err != nil {
		return err
	}
	if c.ProxyRole == "" {
		c.ProxyRole = RoleViewer
	}
	if c.ProxyRole != RoleViewer && c.ProxyRole != RoleReviewer && c.ProxyRole != RoleOperator {
		return fmt.Errorf("console: ProxyRole %q: allowed viewer, reviewer, operator", c.ProxyRole)
	}
	if c.Policy == nil {
		c.Policy = policy.Default()
	}
	if c.MaxRedrives <= 0 {
		c.MaxRedrives = 3
	}
	if c.RedriveRate <= 0 {
		c.RedriveRate = 50
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Server is a running console.
type Server struct {
	cfg    Config
	log    *slog.Logger
	codec  *codec.Codec
	view   *view
	hub    *hub
	prog   progress
	secret []byte
	pages  pages
	jobs   *jobs

	mu     sync.Mutex
	claims map[string]claim // task ID -> decision sent by this replica
}

// claim is a decision this replica sent and the view has not read back yet.
type claim struct {
	By      string
	Approve bool
	At      time.Time
}

// New opens the view and prepares the pages.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	if cfg.Schemas != nil {
		c = c.WithSchemas(cfg.Schemas)
	}
	ps, err := parsePages()
	if err != nil {
		return nil, err
	}
	v, err := openView(cfg.StateDir, cfg.Log)
	if err != nil {
		return nil, err
	}
	secret := cfg.Secret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret)
	}
	s := &Server{cfg: cfg, log: cfg.Log.With("component", "console"), codec: c, view: v, hub: newHub(), secret: secret,
		pages: ps, claims: map[string]claim{}}
	s.jobs = newJobs(s)
	if err := s.jobs.load(); err != nil {
		v.close()
		return nil, err
	}
	return s, nil
}

// topic is the full name of a topic given by its short name.
func (s *Server) topic(short string) string {
	n, _ := s.cfg.Topics.Name(short)
	return n
}

// Handler is the console's HTTP handler.
func (s *Server) Handler() http.Handler { return s.routes() }

// Run serves the console on ln (nil: listen on Config.Listen) and reads the
// topics into the view until ctx ends.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	defer s.view.close()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Listen); err != nil {
			return fmt.Errorf("console: %w", err)
		}
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { errc <- s.ingest(ictx) }()
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	s.log.Info("console: serving", "addr", ln.Addr().String())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	s.jobs.stopAll()
	s.hub.close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	return err
}
