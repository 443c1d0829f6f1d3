package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faultrouter/faultrouter/internal/console"
)

const consoleSynopsis = `usage: faultrouter console --listen :8080 [--state-dir DIR] [--users FILE] [--trust-proxy-header --trusted-proxies CIDRS]
       [--http-tls-cert FILE --http-tls-key FILE] [--public-url URL] [--policy FILE] [--metrics-addr ADDR]
       [--claim-ttl DUR] [--webhooks FILE]

The operator console: review queue (approve, reject, bulk), task timeline,
breakers (reset), dead letter (browse, re-drive as a job) and a live feed of
the alerts topic, in the browser.

It reads a view in --state-dir (Pebble; a cache rebuilt from the committed
topics when empty: a new temporary directory by default) and writes only to
Kafka, as the CLI does. --hash-password reads a password on stdin and prints
its bcrypt hash for the users file. Several replicas may run side by side, each with its
own directory.

Nothing is served without authentication: --users FILE (YAML: name,
password_bcrypt, roles viewer|reviewer|operator, owners), and/or
--trust-proxy-header to take X-Forwarded-User / X-Forwarded-Email from a
reverse proxy (oauth2-proxy) that sets them; only behind such a proxy, and
only from the addresses of --trusted-proxies (the header is stripped from
anyone else, and the refusal logged and counted).
FAULTROUTER_CONSOLE_SECRET signs sessions and CSRF tokens: give replicas
behind one address the same value.

Sign-in attempts are limited per account (5 per 15 minutes, counted before
the password is compared) and per client address (20; an IPv6 address
counts by its /64). Behind an ingress, give its addresses to
--trusted-proxies so that the client address comes from X-Forwarded-For
(this does not turn on header identity). A browser that signed in as the
person before (a signed device cookie) is limited on its own, so failures
caused by others never lock a person out of their own browser. Every
failed and throttled sign-in is in the operator log; the addresses are
shown to operators only.

A session ends 12h after sign-in, after --session-idle without use, when
its person leaves the users file or changes password (the file is read
again when it changes and on SIGHUP), and when its person signs out: the
sign-out goes to the console topic, so a copied cookie stops working on
every replica.

Over HTTPS, --http-tls-cert/--http-tls-key (TLS at the console) or
--public-url https://... (TLS at an ingress in front) make the cookies
Secure and add Strict-Transport-Security.

A reviewer claims a review item to work on it (others see who holds it and
may not decide it); an operator assigns one. A claim ends by itself after
--claim-ttl; claims go to the console topic, so every replica agrees.

--webhooks FILE (YAML: owners: {OWNER: URL}, "*" for the rest; http or
https only) posts new high-priority items and items past their SLA to each
owner's webhook as Slack-compatible JSON, retried with backoff; every
delivery is in the operator log. Replicas with the same file send each
notice once.`

func consoleCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("console", consoleSynopsis, stderr)
	var (
		listen     = fs.String("listen", ":8080", "HTTP address")
		stateDir   = fs.String("state-dir", "", "Pebble directory of the view (default: a new temporary directory)")
		usersFile  = fs.String("users", os.Getenv("FAULTROUTER_CONSOLE_USERS"), "users file (YAML, bcrypt hashes) (env FAULTROUTER_CONSOLE_USERS)")
		trustProxy = fs.Bool("trust-proxy-header", false, "identify people by X-Forwarded-User / X-Forwarded-Email (only behind a proxy that sets them; needs --trusted-proxies)")
		proxies    = fs.String("trusted-proxies", "", "comma-separated CIDRs (or addresses) the reverse proxy or ingress connects from: from them the client address is taken from X-Forwarded-For (sign-in limits, operator log), and with --trust-proxy-header the identity header is believed from them only")
		tlsCert    = fs.String("http-tls-cert", "", "PEM certificate: serve HTTPS (cookies Secure, HSTS); --tls-cert is the Kafka client's")
		tlsKey     = fs.String("http-tls-key", "", "PEM key of --http-tls-cert")
		publicURL  = fs.String("public-url", "", "the address people open, e.g. https://console.example.com when TLS ends at an ingress (https: cookies Secure, HSTS)")
		idle       = fs.Duration("session-idle", 30*time.Minute, "end a session unused for this long (a session ends 12h after sign-in in any case)")
		topic      = fs.String("console-topic", "", "the console's own topic of sign-outs, shared by replicas (default: faultrouter.console with the topic prefix; created when missing)")
		metrics    = fs.String("metrics-addr", "", "serve Prometheus /metrics on this address (e.g. :9464; off when empty)")
		proxyRole  = fs.String("proxy-role", "viewer", "role of a proxy-identified person missing from the users file: viewer, reviewer or operator")
		policyFile = fs.String("policy", "", "the router's policy file: the reject message and breaker cooldowns (default: the built-in policy)")
		maxRedr    = fs.Int("max-redrives", 3, "loop guard: refuse records already re-driven this many times")
		retention  = fs.Duration("view-retention", console.DefaultViewRetention, "how long the view keeps a decided review item, an alert and a dead-letter copy (open items stay until decided); at least 1m")
		rate       = fs.Int("redrive-rate", 50, "default records per second of a re-drive job")
		maxRate    = fs.Int("max-redrive-rate", 500, "ceiling of a re-drive job's records per second; a higher rate is refused")
		claimTTL   = fs.Duration("claim-ttl", console.DefaultClaimTTL, "a claim on a review item ends by itself after this long (1s to 12h)")
		webhooks   = fs.String("webhooks", "", "owners' webhooks file (YAML): notify new high-priority items and items past their SLA")
		hash       = fs.Bool("hash-password", false, "read a password from stdin, print its bcrypt hash for the users file, and exit")
	)
	regFlags := addRegistryFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *hash {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("console --hash-password: reading the password from stdin: %w", err)
		}
		h, err := console.HashPassword(strings.TrimRight(line, "\r\n"))
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, h)
		return nil
	}
	log, err := g.logger(stderr)
	if err != nil {
		return err
	}
	cfg := console.Config{Listen: *listen, StateDir: *stateDir, TrustProxy: *trustProxy, ProxyRole: *proxyRole,
		TLSCert: *tlsCert, TLSKey: *tlsKey, PublicURL: *publicURL, UsersFile: *usersFile, SessionIdle: *idle, ConsoleTopic: *topic,
		MaxRedrives: *maxRedr, ViewRetention: *retention, RedriveRate: *rate, MaxRedriveRate: *maxRate, Log: log, Secret: []byte(os.Getenv("FAULTROUTER_CONSOLE_SECRET")),
		ClaimTTL: *claimTTL}
	if cfg.TrustedProxies, err = parseCIDRs(*proxies); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	if cfg.Schemas, err = regFlags.schemas(); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if *usersFile != "" {
		if cfg.Users, err = console.LoadUsers(*usersFile); err != nil {
			return err
		}
	}
	if *webhooks != "" {
		if cfg.Webhooks, err = console.LoadWebhooks(*webhooks); err != nil {
			return err
		}
	}
	if *policyFile != "" {
		if cfg.PolicyFile, err = os.ReadFile(*policyFile); err != nil {
			return fmt.Errorf("console: --policy: %w", err)
		}
		if cfg.Policy, err = loadPolicy(*policyFile); err != nil {
			return err
		}
	}
	if cfg.Topics, err = g.topics(); err != nil {
		return err
	}
	if cfg.Kafka, err = g.clientOpts(log); err != nil {
		return err
	}
	if cfg.StateDir == "" {
		if cfg.StateDir, err = os.MkdirTemp("", "faultrouter-console-"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.StateDir)
	}
	srv, err := console.New(cfg)
	if err != nil {
		return err
	}
	// SIGHUP reads the users file again (it is also read when it changes)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := srv.ReloadUsers(); err != nil {
				log.Error("console: SIGHUP: users file not reloaded", "err", err)
			}
		}
	}()
	if *metrics != "" {
		ms, err := serveMetrics(*metrics, reg, func() bool { return true })
		if err != nil {
			return err
		}
		defer ms.Close()
	}
	scheme := "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "console: %s://%s (view in %s)\n", scheme, displayAddr(*listen), cfg.StateDir)
	return ctxErr(ctx, srv.Run(ctx, nil))
}

// displayAddr turns ":8080" into "localhost:8080".
func displayAddr(addr string) string {
	if len(addr) > 0 && addr[0] == ':' {
		return "localhost" + addr
	}
	return addr
}

// parseCIDRs parses --trusted-proxies: CIDRs or single addresses, comma
// separated.
func parseCIDRs(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("console --trusted-proxies: %q is neither a CIDR (10.42.0.0/16) nor an address (10.42.0.7)", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}
