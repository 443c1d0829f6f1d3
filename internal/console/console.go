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
// own. It writes only to Kafka, through internal/control as the CLI does: review
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
// Reviewers claim items and operators assign them (claims.go: records on
// the console topic, shared by the replicas); the queue is worked from the
// keyboard (static/console.js); owners' webhooks hear of new high-priority
// items and items past their SLA (notify.go).
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
	"crypto/sha256"
	"crypto/tls"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	// TrustedProxies are the addresses (CIDRs) of the reverse proxy (an
	// ingress controller, oauth2-proxy). From a direct peer in one of them
	// the client address, for the sign-in limits and the operator log, is
	// the last X-Forwarded-For hop outside them; with TrustProxy the
	// identity headers are believed from them only, and stripped from any
	// other request. Required with TrustProxy; useful without it.
	TrustedProxies []netip.Prefix
	// TLSCert and TLSKey are PEM files: the console serves HTTPS itself.
	TLSCert, TLSKey string
	// PublicURL is the address people open, e.g. https://console.example.com
	// when TLS ends at an ingress in front. With https (or TLSCert) cookies
	// are Secure and responses carry Strict-Transport-Security.
	PublicURL string
	// ReadTimeout, WriteTimeout and IdleTimeout bound a request's reading,
	// a response's writing (extended by every write of the live updates)
	// and a kept-alive connection; 30s, 60s and 120s when zero.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// LoginFailuresPerUser and LoginFailuresPerAddress are the sign-in
	// attempts allowed per account (and per known device of an account) and
	// per client address within LoginWindow, counted before the password is
	// compared, a success given back; beyond them sign-in answers 429 with
	// Retry-After (5, 20, 15 minutes when zero). See throttle.go.
	LoginFailuresPerUser, LoginFailuresPerAddress int
	LoginWindow                                   time.Duration
	// UsersFile is the users file's path: it is read again when it changes
	// (checked every UsersCheck, 5s when zero) and on ReloadUsers.
	UsersFile  string
	UsersCheck time.Duration
	// SessionIdle ends a session unused for that long (30 minutes when
	// zero); a session ends 12 hours after sign-in in any case.
	SessionIdle time.Duration
	// ConsoleTopic is the console's own topic (sign-outs); by default
	// faultrouter.console with the topics' prefix, created when missing.
	ConsoleTopic string
	// ProxyRole is the role of a proxy-identified person missing from the
	// users file: viewer (the default), reviewer or operator.
	ProxyRole string
	// Secret signs sessions and CSRF tokens; replicas behind one address
	// share it. Random when empty (sessions end with the process).
	Secret []byte
	// Policy words the end-user message of a reject and gives the breaker
	// cooldowns; the default policy when nil. Use the router's policy file.
	Policy *policy.Policy
	// PolicyFile is the text of Policy's file, the base of the Advise
	// page's candidate; empty for the built-in policy.
	PolicyFile []byte
	// MaxRedrives is the re-drive loop guard (default 3, as replay).
	MaxRedrives int
	// ViewRetention is how long the view keeps a decided review item (from
	// its decision), an alert and a dead-letter copy (from their record
	// time); an open review item is kept until it is decided. Default
	// DefaultViewRetention (30 days), at least MinViewRetention.
	ViewRetention time.Duration
	// RedriveRate is the default records per second of a re-drive job
	// (default 50).
	RedriveRate int
	// Registerer takes the console's metrics (none when nil).
	Registerer prometheus.Registerer
	// MaxRedriveRate is the ceiling of a re-drive job's rate, records per
	// second (default 500).
	MaxRedriveRate int
	// ClaimTTL is how long a claim on a review item holds before it ends by
	// itself (DefaultClaimTTL when zero, at most MaxClaimTTL).
	ClaimTTL time.Duration
	// Webhooks notify each owner's channel of new high-priority items and
	// of items past their SLA (notify.go); none when nil.
	Webhooks *Webhooks
	// Log is the logger (slog.Default() when nil).
	Log *slog.Logger
}

// MinSecretLen is the shortest session secret accepted, in bytes.
const MinSecretLen = 32

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
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("console: TLSCert and TLSKey (--http-tls-cert, --http-tls-key): give both PEM files, or neither")
	case c.PublicURL != "" && !validPublicURL(c.PublicURL):
		return fmt.Errorf("console: PublicURL (--public-url) %q: give the address people open, http:// or https:// and a host, e.g. https://console.example.com", c.PublicURL)
	case len(c.Secret) > 0 && len(c.Secret) < MinSecretLen:
		return fmt.Errorf("console: FAULTROUTER_CONSOLE_SECRET: %d bytes; give at least %d random bytes (e.g. openssl rand -hex 32), the same to every replica", len(c.Secret), MinSecretLen)
	case c.TrustProxy && len(c.TrustedProxies) == 0:
		return errors.New("console: TrustedProxies (--trusted-proxies): required with --trust-proxy-header: the CIDRs the reverse proxy connects from, e.g. 10.42.0.0/16; the header is believed from them only")
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
	switch {
	case c.ViewRetention == 0:
		c.ViewRetention = DefaultViewRetention
	case c.ViewRetention < MinViewRetention:
		return fmt.Errorf("console: ViewRetention (--view-retention) %s: want at least %s, e.g. 720h (30 days, the default)", c.ViewRetention, MinViewRetention)
	}
	if c.RedriveRate <= 0 {
		c.RedriveRate = 50
	}
	if c.MaxRedriveRate <= 0 {
		c.MaxRedriveRate = 500
	}
	if c.RedriveRate > c.MaxRedriveRate {
		return fmt.Errorf("console: RedriveRate (--redrive-rate) %d: above the ceiling MaxRedriveRate (--max-redrive-rate) %d", c.RedriveRate, c.MaxRedriveRate)
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Webhooks != nil {
		w := *c.Webhooks // the defaults go into this console's copy
		if err := w.Validate(); err != nil {
			return err
		}
		c.Webhooks = &w
	}
	if c.ClaimTTL == 0 {
		c.ClaimTTL = DefaultClaimTTL
	}
	if c.ClaimTTL < time.Second || c.ClaimTTL > MaxClaimTTL {
		return fmt.Errorf("console: ClaimTTL (--claim-ttl) %s: allowed 1s to %s", c.ClaimTTL, MaxClaimTTL)
	}
	if c.LoginFailuresPerUser <= 0 {
		c.LoginFailuresPerUser = 5
	}
	if c.LoginFailuresPerAddress <= 0 {
		c.LoginFailuresPerAddress = 20
	}
	if c.LoginWindow <= 0 {
		c.LoginWindow = 15 * time.Minute
	}
	if c.SessionIdle <= 0 {
		c.SessionIdle = 30 * time.Minute
	}
	if c.UsersCheck <= 0 {
		c.UsersCheck = 5 * time.Second
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 60 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	return nil
}

func validPublicURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// https reports whether people reach the console over HTTPS, at the console
// or at an ingress in front: then cookies are Secure and HSTS is sent.
func (c *Config) https() bool {
	return c.TLSCert != "" || strings.HasPrefix(strings.ToLower(c.PublicURL), "https://")
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
	met    *metrics
	limit  *limiter
	// bcrypt holds a slot per running password compare, timelines one per
	// timeline being read.
	bcrypt, timelines chan struct{}

	usersNow atomic.Pointer[Users]
	producer *kgo.Client

	mu        sync.Mutex
	sent      map[string]sentDecision // task ID -> decision sent by this replica
	signedOut map[string]time.Time    // session ID -> when it was signed out
	// allOutBefore: person -> sessions signed in up to then are signed out
	allOutBefore map[string]time.Time
	usersSum     [32]byte             // of the users file as last read
	usedSets     map[string]time.Time // confirmed selections -> when
	firstUse     map[string]string    // confirmed selection -> the use that acts on it (fixedset.go)
	consoleParts atomic.Int32         // the console topic's partition count at start
	claims       map[string]claim     // task ID -> who holds its item (claims.go)
	leases       map[string]claim     // notice key -> the replica sending it (notify.go)
	instance     string               // this replica, for the leases
	claimsPruned time.Time
	consoleNext  map[int32]int64 // console topic: the next offset to apply

	whatifBusy sync.Mutex // whatif.go: one what-if at a time
}

// sentDecision is a decision this replica sent and the view has not read back yet.
type sentDecision struct {
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
	if cfg.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey); err != nil {
			return nil, fmt.Errorf("console: --http-tls-cert %s / --http-tls-key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
		}
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
		pages: ps, sent: map[string]sentDecision{}, met: newMetrics(cfg.Registerer),
		limit: newLimiter(cfg.LoginWindow), bcrypt: make(chan struct{}, 2*runtime.GOMAXPROCS(0)),
		timelines: make(chan struct{}, timelineReads)}
	s.signedOut, s.usedSets, s.allOutBefore = map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	s.claims, s.leases, s.consoleNext = map[string]claim{}, map[string]claim{}, map[int32]int64{}
	s.firstUse = map[string]string{}
	inst := make([]byte, 8)
	rand.Read(inst)
	s.instance = hex.EncodeToString(inst)
	s.usersNow.Store(cfg.Users)
	if cfg.UsersFile != "" {
		if b, err := os.ReadFile(cfg.UsersFile); err == nil {
			s.usersSum = sha256.Sum256(b)
		}
	}
	s.jobs = newJobs(s)
	if err := s.jobs.load(); err != nil {
		v.close()
		return nil, err
	}
	return s, nil
}

// topic is the full name of a topic given by its short name.
func (s *Server) topic(short topicspec.Short) string {
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
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: min(10*time.Second, s.cfg.ReadTimeout), ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.WriteTimeout, IdleTimeout: s.cfg.IdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 3)
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	prod, err := kgo.NewClient(s.cfg.Kafka...)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer prod.Close()
	s.producer = prod
	// sessions are checked against the sign-outs: read them before serving
	ready := make(chan struct{})
	go func() {
		if err := s.readConsoleTopic(ictx, ready); err != nil {
			errc <- err
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		ln.Close()
		return nil
	case err := <-errc:
		ln.Close()
		return err
	}
	go s.watchUsers(ictx)
	if s.cfg.Webhooks != nil {
		go newNotifier(s, s.cfg.Webhooks).run(ictx)
	}
	ingested := make(chan struct{})
	go func() {
		defer close(ingested)
		if err := s.ingest(ictx); err != nil {
			errc <- err
		}
	}()
	serve := func() error { return srv.Serve(ln) }
	if s.cfg.TLSCert != "" {
		serve = func() error { return srv.ServeTLS(ln, s.cfg.TLSCert, s.cfg.TLSKey) }
	}
	go func() {
		if err := serve(); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	s.log.Info("console: serving", "addr", ln.Addr().String())
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	<-ingested // the view closes after its last write
	s.jobs.stopAll()
	s.hub.close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	return err
}
