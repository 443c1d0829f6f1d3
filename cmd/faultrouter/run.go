package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/gcpace"
	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const runSynopsis = `usage: faultrouter run --state-dir DIR [--policy FILE] [--metrics-addr :9464] [--instance-id ID]

Runs the router: consumes ingress and decisions in the consumer group
(--group), routes every event exactly once, and keeps task state in Pebble
under --state-dir (restored from the state changelog topic on start).
Missing topics are created from topics/; the router refuses to start when
existing topics contradict the spec or ingress, decisions and state are not
co-partitioned. Metrics, /healthz and /readyz are served on --metrics-addr.`

func runCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("run", runSynopsis, stderr)
	host, _ := os.Hostname()
	var (
		stateDir    = fs.String("state-dir", "", "directory of the Pebble state store (required)")
		policyFile  = fs.String("policy", "", "policy file (YAML); default: the built-in policy (see `faultrouter policy default`)")
		metricsAddr = fs.String("metrics-addr", ":9464", "address of /metrics, /healthz and /readyz; empty to disable")
		instanceID  = fs.String("instance-id", envOr("FAULTROUTER_INSTANCE_ID", host), "stable, unique instance ID; the transactional ID is <group>-<instance-id> (env FAULTROUTER_INSTANCE_ID)")
		group       = fs.String("group", "faultrouter", "consumer group")
		partitions  = fs.Int("partitions", 0, "partition count when creating topics (default: topics/, 6)")
		rf          = fs.Int("replication-factor", 0, "replication factor when creating topics (default: topics/, 1; production: 3)")
		maxBytes    = fs.Int("max-record-bytes", 512<<10, "largest input record value routed; larger ones are dead-lettered")
		partCheck   = fs.Duration("partition-check", 30*time.Second, "how often the partition counts of ingress, decisions and state are read to detect partitions added at runtime")
		sessionTO   = fs.Duration("session-timeout", router.Default().SessionTimeout, "consumer group session timeout: how long the partitions of a crashed instance wait before the group moves them; within the broker's group.min/max.session.timeout.ms (env FAULTROUTER_SESSION_TIMEOUT)")
		static      = fs.Bool("static-membership", false, "join the group as a static member named by --instance-id (a restarted instance takes its partitions back at once); for instance IDs that name one instance for good, such as a StatefulSet's pods (env FAULTROUTER_STATIC_MEMBERSHIP=true)")
		groupProto  = fs.String("group-protocol", router.Default().GroupProtocol, "how the consumer group rebalances: eager revokes every partition of every instance at each rebalance; cooperative moves only what balances the group and keeps the rest routing, once every instance of the group runs with it (env FAULTROUTER_GROUP_PROTOCOL)")
		compression = fs.String("compression", router.Default().Compression, "codec of the record batches the router writes: "+strings.Join(router.Compressions, ", ")+"; none spends no CPU on it (Kafka's producer default), the others trade CPU for bytes on the network and the brokers' disks")
		heapBudget  = fs.Int("heap-budget-mib", gcpace.DefaultBudget>>20, "the Go heap (MiB) the garbage collector paces to: while the live heap is under a third of it the collector runs half as often as Go's default (GOGC 200), from half of it as often (100); 0: Go's default always. A GOGC environment variable overrides it")
		regLookup   = fs.Bool("registry-lookup-only", false, "with --wire-format confluent: look up the output schemas in the registry instead of registering them at start (register them with `faultrouter schemas register`)")
	)
	regFlags := addRegistryFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := durationFromEnv(fs, "session-timeout", "FAULTROUTER_SESSION_TIMEOUT", sessionTO); err != nil {
		return err
	}
	if err := boolFromEnv(fs, "static-membership", "FAULTROUTER_STATIC_MEMBERSHIP", static); err != nil {
		return err
	}
	if v, ok := os.LookupEnv("FAULTROUTER_GROUP_PROTOCOL"); ok && !flagSet(fs, "group-protocol") {
		*groupProto = v
	}
	switch {
	case *stateDir == "":
		return errors.New("run: --state-dir is required (a directory for the Pebble state store)")
	case *maxBytes <= 0:
		return fmt.Errorf("run: --max-record-bytes must be a positive number of bytes, got %d", *maxBytes)
	case *instanceID == "":
		return errors.New("run: --instance-id must not be empty (a stable, unique name per instance)")
	case *group == "":
		return errors.New("run: --group must not be empty")
	case *partCheck <= 0:
		return fmt.Errorf("run: --partition-check must be a positive duration, got %s", *partCheck)
	case *sessionTO < time.Second:
		return fmt.Errorf("run: --session-timeout must be at least 1s (and within the broker's group.min/max.session.timeout.ms, 6s..30m by default), got %s", *sessionTO)
	case *heapBudget < 0:
		return fmt.Errorf("run: --heap-budget-mib must be 0 (Go's default pacing) or a positive number of MiB, got %d", *heapBudget)
	case !slices.Contains(router.GroupProtocols, *groupProto):
		return fmt.Errorf("run: --group-protocol (env FAULTROUTER_GROUP_PROTOCOL) must be one of %s, got %q", strings.Join(router.GroupProtocols, ", "), *groupProto)
	case !slices.Contains(router.Compressions, *compression):
		return fmt.Errorf("run: --compression must be one of %s, got %q", strings.Join(router.Compressions, ", "), *compression)
	}
	wire, err := regFlags.wire()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	regCodec, err := codec.New()
	if err != nil {
		return err
	}
	schemaRegistry, err := regFlags.client(regCodec)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	// a line per decision: formatted and written off the routing goroutine
	log, closeLog, err := logging.NewAsync(stderr, logging.Format(g.logFormat), g.logLevel)
	if err != nil {
		return err
	}
	defer closeLog()
	pol := policy.Default()
	if *policyFile != "" {
		if pol, err = loadPolicy(*policyFile); err != nil {
			return err
		}
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	if set, err = overrideTopics(set, *partitions, *rf); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	opts, err := g.clientOpts(log)
	if err != nil {
		return err
	}
	if err := ensureTopics(ctx, opts, set, log); err != nil {
		return ctxErr(ctx, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := router.Default()
	cfg.ClientOpts = opts
	cfg.Topics = set.Topics()
	cfg.StateDir = *stateDir
	cfg.Policy = pol
	cfg.Group = *group
	cfg.InstanceID = *instanceID
	cfg.MaxRecordBytes = *maxBytes
	cfg.PartitionCheck = *partCheck
	cfg.SessionTimeout, cfg.StaticMembership = *sessionTO, *static
	cfg.Compression = *compression
	cfg.GroupProtocol = *groupProto
	cfg.Logger = log
	cfg.Registerer = reg
	cfg.Registry, cfg.WireFormat, cfg.LookupSchemasOnly = schemaRegistry, wire, *regLookup
	rt, err := router.New(cfg)
	if err != nil {
		return err
	}
	defer gcpace.Tune(int64(*heapBudget) << 20)()
	if *metricsAddr != "" {
		srv, err := serveMetrics(*metricsAddr, reg, rt.Ready)
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("metrics listening", "addr", srv.Addr)
	}
	return rt.Run(ctx)
}

// ensureTopics creates the missing topics and checks the existing ones.
func ensureTopics(ctx context.Context, opts []kgo.Opt, set topicspec.Set, log *slog.Logger) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := set.Ensure(ctx, kadm.NewClient(cl), log); err != nil {
		return fmt.Errorf("run: refusing to start: %w", err)
	}
	return nil
}

// serveMetrics serves /metrics, /healthz and /readyz on addr.
func serveMetrics(addr string, reg *prometheus.Registry, ready func() bool) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "restoring state or waiting for partitions", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}

func itoa(n int) string { return strconv.Itoa(n) }

// durationFromEnv sets *d from the environment variable key unless the
// flag name was given; a value that is not a duration is an error naming it.
func durationFromEnv(fs *flag.FlagSet, name, key string, d *time.Duration) error {
	v, ok := os.LookupEnv(key)
	if !ok || flagSet(fs, name) {
		return nil
	}
	parsed, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("run: %s=%q is not a duration (such as 10s)", key, v)
	}
	*d = parsed
	return nil
}

// boolFromEnv sets *b from the environment variable key unless the flag
// name was given; a value other than true or false is an error naming it.
func boolFromEnv(fs *flag.FlagSet, name, key string, b *bool) error {
	v, ok := os.LookupEnv(key)
	if !ok || flagSet(fs, name) {
		return nil
	}
	switch v {
	case "true":
		*b = true
	case "false", "":
		*b = false
	default:
		return fmt.Errorf("run: %s=%q must be true or false", key, v)
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
