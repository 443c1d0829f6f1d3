package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/console"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

const consoleSynopsis = `usage: faultrouter console --listen :8080 [--state-dir DIR] [--users FILE] [--trust-proxy-header] [--policy FILE]

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
reverse proxy (oauth2-proxy) that sets them; only behind such a proxy.
FAULTROUTER_CONSOLE_SECRET signs sessions and CSRF tokens: give replicas
behind one address the same value.`

func consoleCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("console", consoleSynopsis, stderr)
	var (
		listen     = fs.String("listen", ":8080", "HTTP address")
		stateDir   = fs.String("state-dir", "", "Pebble directory of the view (default: a new temporary directory)")
		usersFile  = fs.String("users", os.Getenv("FAULTROUTER_CONSOLE_USERS"), "users file (YAML, bcrypt hashes) (env FAULTROUTER_CONSOLE_USERS)")
		trustProxy = fs.Bool("trust-proxy-header", false, "identify people by X-Forwarded-User / X-Forwarded-Email (only behind a proxy that sets them)")
		proxyRole  = fs.String("proxy-role", "viewer", "role of a proxy-identified person missing from the users file: viewer, reviewer or operator")
		policyFile = fs.String("policy", "", "the router's policy file: the reject message and breaker cooldowns (default: the built-in policy)")
		maxRedr    = fs.Int("max-redrives", 3, "loop guard: refuse records already re-driven this many times")
		rate       = fs.Int("redrive-rate", 50, "default records per second of a re-drive job")
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
		MaxRedrives: *maxRedr, RedriveRate: *rate, Log: log, Secret: []byte(os.Getenv("FAULTROUTER_CONSOLE_SECRET"))}
	if cfg.Schemas, err = regFlags.schemas(); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if *usersFile != "" {
		if cfg.Users, err = console.LoadUsers(*usersFile); err != nil {
			return err
		}
	}
	if *policyFile != "" {
		if cfg.Policy, err = policy.Load(*policyFile); err != nil {
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
	fmt.Fprintf(stdout, "console: http://%s (view in %s)\n", displayAddr(*listen), cfg.StateDir)
	return ctxErr(ctx, srv.Run(ctx, nil))
}

// displayAddr turns ":8080" into "localhost:8080".
func displayAddr(addr string) string {
	if len(addr) > 0 && addr[0] == ':' {
		return "localhost" + addr
	}
	return addr
}
