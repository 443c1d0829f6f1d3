// Package router is faultrouter's stream processor. It consumes the ingress
// and review-decision topics in a consumer group with read_committed, and for
// every poll batch it decodes, deduplicates against the task state, classifies
// and decides with the policy, and produces the routed records, one audit
// record per input record and the state changelog records, committing the
// consumed offsets in the same Kafka transaction. The Pebble store is updated
// only after that transaction commits, and restored from the changelog topic on
// start and on every partition assignment.
//
// One transaction per batch (a poll and its top-up; under a backlog several
// polls, batchsize.go): the commit interval, the time from one commit to
// the next, is one batch's work and the poll that starts the next batch. A
// record that arrives while a batch is routed is routed in the next one, so
// its latency to a committed audit record is the rest of one commit interval
// and one more, plus the broker's commit markers (docs/performance.md, Commit interval and latency).
//
// A Router is an orchestration of parts, each a package of its own entered
// through one type: decode.Decoder (records in, inputs out),
// refuse.Refusals (what the broker refuses), emit.Records (the output
// records), hold.Breakers (breaker holding: breakers, held retries,
// latches, the shared breakers topic and the alerts), forward.Forwarder (a
// task's home partition, forwarding, partition counts), sweep.Sweeper
// (expiry, and the sweep for due retries and overdue reviews),
// restore.Restorer (the store restored from the changelog on an
// assignment) and txn.Txn (a batch's transaction, fenced by the group).
// This package holds the run loop, the batch's task states and the
// decisions on them, and handle.go, the data path of one batch, top to
// bottom, calling the parts.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/internal/router/forward"
	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/internal/router/refuse"
	"github.com/faultrouter/faultrouter/internal/router/restore"
	"github.com/faultrouter/faultrouter/internal/router/sweep"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Topics are the full names of the topics the router reads and writes
// (Breakers optional: package hold).
type Topics = topicspec.Topics

// Config configures a Router. Default returns the defaults; Validate names
// the first bad field.
type Config struct {
	// ClientOpts are the franz-go options reaching the cluster (seed brokers,
	// SASL, TLS, logger). Required.
	ClientOpts []kgo.Opt
	// Topics are the topic names. Required.
	Topics Topics
	// StateDir is the Pebble directory. Required.
	StateDir string
	// Policy is the failure policy. Default: policy.Default().
	Policy *policy.Policy
	// Group is the consumer group. Default "faultrouter".
	Group string
	// InstanceID names this instance; the transactional ID is
	// "<Group>-<InstanceID>", so it must be stable across restarts and unique
	// among running instances. Default "0".
	InstanceID string
	// MaxRecordBytes is the largest input value routed; larger ones go to the
	// dead-letter topic. It must stay below the dead-letter topic's
	// max.message.bytes. Default 512 KiB.
	MaxRecordBytes int
	// MaxPollRecords bounds one batch (one transaction) at light load.
	// Larger batches spread the fixed cost of a transaction (its offset
	// commit and end markers) over more records. Default 5000.
	MaxPollRecords int
	// MaxPollBytes bounds the bytes of one fetch from the brokers, and the
	// keys and values of a batch at light load. Default 16 MiB.
	MaxPollBytes int
	// MaxBatchRecords bounds one batch under a backlog: a batch that filled
	// its limit and left records behind doubles the next one's, up to
	// this (batchsize.go). It is the memory bound of a batch: a router
	// holds two batches (one is written to Pebble while the next is
	// routed), each about 4 KiB a record in flight, and the garbage
	// collector's headroom doubles that. At least MaxPollRecords. Default
	// 8000.
	MaxBatchRecords int
	// MaxBatchBytes bounds the keys and values of one batch under a
	// backlog (a batch may pass it by one fetch). At least MaxPollBytes.
	// Default 16 MiB.
	MaxBatchBytes int
	// MaxBatchLatency bounds the time from a batch's poll to its commit
	// under a backlog: a batch grows only as far as the last one's rate
	// routes within it. Default 500ms.
	MaxBatchLatency time.Duration
	// Tick is how often due retries are looked for when no input arrives.
	// Default 200ms.
	Tick time.Duration
	// TransactionTimeout is the Kafka transaction timeout. Default 30s.
	TransactionTimeout time.Duration
	// SessionTimeout is the consumer-group session timeout: how long a
	// crashed instance holds its partitions before the group moves them. It
	// must lie within the broker's group.min/max.session.timeout.ms
	// (6s..30min by default). Heartbeats go every heartbeatInterval (a
	// tenth of it at most), so a member expires only after many heartbeats
	// in a row went unanswered. Default 10s.
	SessionTimeout time.Duration
	// StaticMembership makes this instance a static member of the group
	// (KIP-345), its group.instance.id the InstanceID: a restarted
	// instance (a crash, a pod rescheduled) takes its partitions back as
	// soon as it rejoins, without waiting for the session timeout and
	// without moving the others' partitions; a clean shutdown still leaves
	// the group (Run), so that its partitions move at once. Use it where
	// each instance ID names one instance for good (a StatefulSet's pod
	// names). Default false.
	StaticMembership bool
	// Logger receives the router's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the router's metrics. Default: none registered.
	Registerer prometheus.Registerer
	// Now is the router clock. Default time.Now.
	Now func() time.Time
	// Registry reads input records in the Confluent wire format (a schema
	// registry's); nil: only Avro's single-object encoding is read, and a
	// record in the Confluent format is dead-lettered.
	Registry *registry.Client
	// WireFormat is the framing of the routed records and alerts the router
	// writes; the state changelog is always in the single-object encoding.
	// Default single-object; confluent needs Registry.
	WireFormat registry.WireFormat
	// LookupSchemasOnly, with the Confluent wire format, makes the router
	// look up its output schemas in the registry instead of registering
	// them at start (for registries that only an operator writes to:
	// faultrouter schemas register). Default false.
	LookupSchemasOnly bool
	// PartitionCheck is how often the partition counts of ingress,
	// decisions and state are read to detect partitions added at runtime.
	// Default 30s.
	PartitionCheck time.Duration
	// Compression is the codec of the record batches the router writes
	// (routed, audit and state records): one of Compressions. Default
	// "none", as for Kafka's own producers: compressing costs the router
	// about a twentieth of its CPU an event on a backlog, for output that
	// is small Avro records; a cluster that pays more for bytes (network
	// between zones, disk) than for CPU sets snappy, lz4 or zstd.
	Compression string
	// GroupProtocol is how the consumer group rebalances: one of
	// GroupProtocols. "cooperative" (the default) moves only what balances
	// the group and keeps the rest routing (balancer.go); "eager" revokes
	// every partition of every instance at each rebalance. A
	// cooperative instance offers the eager protocol too, so a group is
	// cooperative only once every member is configured so.
	GroupProtocol string

	// storeOptions, in tests, adjusts the store's options (its file
	// system, its memtable size)
	storeOptions func(*store.Options)
}

// GroupProtocols are the values Config.GroupProtocol takes
// (--group-protocol).
var GroupProtocols = []string{"eager", "cooperative"}

// Compressions are the values Config.Compression takes (--compression).
var Compressions = []string{"none", "snappy", "lz4", "zstd", "gzip"}

// compressionCodec is the franz-go codec named name.
func compressionCodec(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "none", "": // "": a Config not from Default
		return kgo.NoCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("%q is not one of %s", name, strings.Join(Compressions, ", "))
}

// Default returns a Config with every optional field at its default.
func Default() Config {
	return Config{
		Policy:             policy.Default(),
		Group:              "faultrouter",
		InstanceID:         "0",
		MaxRecordBytes:     512 << 10,
		MaxPollRecords:     5000,
		MaxPollBytes:       16 << 20,
		MaxBatchRecords:    8000,
		MaxBatchBytes:      16 << 20,
		MaxBatchLatency:    500 * time.Millisecond,
		Tick:               200 * time.Millisecond,
		TransactionTimeout: 30 * time.Second,
		SessionTimeout:     10 * time.Second,
		Logger:             slog.Default(),
		Now:                time.Now,
		PartitionCheck:     30 * time.Second,
		WireFormat:         registry.SingleObject,
		Compression:        "none",
		GroupProtocol:      "cooperative",
	}
}

// Validate returns an error naming the first field that is missing or bad.
func (c *Config) Validate() error {
	switch {
	case len(c.ClientOpts) == 0:
		return errors.New("router: ClientOpts: required (at least the seed brokers)")
	case c.Topics.Ingress == "" || c.Topics.Decisions == "" || c.Topics.Retry == "" ||
		c.Topics.Review == "" || c.Topics.Audit == "" || c.Topics.DeadLetter == "" ||
		c.Topics.Alerts == "" || c.Topics.State == "":
		return errors.New("router: Topics: every topic name is required")
	case c.StateDir == "":
		return errors.New("router: StateDir: required (--state-dir)")
	case c.Policy == nil:
		return errors.New("router: Policy: required")
	case c.Group == "":
		return errors.New("router: Group: required")
	case c.InstanceID == "":
		return errors.New("router: InstanceID: required (--instance-id)")
	case c.MaxRecordBytes <= 0:
		return fmt.Errorf("router: MaxRecordBytes: must be > 0, got %d", c.MaxRecordBytes)
	case c.MaxPollRecords <= 0:
		return fmt.Errorf("router: MaxPollRecords: must be > 0, got %d", c.MaxPollRecords)
	case c.MaxPollBytes < c.MaxRecordBytes:
		return fmt.Errorf("router: MaxPollBytes: must be >= MaxRecordBytes (%d), got %d", c.MaxRecordBytes, c.MaxPollBytes)
	case c.MaxBatchRecords < c.MaxPollRecords:
		return fmt.Errorf("router: MaxBatchRecords: must be >= MaxPollRecords (%d), got %d", c.MaxPollRecords, c.MaxBatchRecords)
	case c.MaxBatchBytes < c.MaxPollBytes:
		return fmt.Errorf("router: MaxBatchBytes: must be >= MaxPollBytes (%d), got %d", c.MaxPollBytes, c.MaxBatchBytes)
	case c.MaxBatchLatency <= 0:
		return fmt.Errorf("router: MaxBatchLatency: must be > 0, got %s", c.MaxBatchLatency)
	case c.Tick <= 0:
		return fmt.Errorf("router: Tick: must be > 0, got %s", c.Tick)
	case c.TransactionTimeout < time.Second:
		return fmt.Errorf("router: TransactionTimeout: must be >= 1s, got %s", c.TransactionTimeout)
	case c.SessionTimeout < time.Second:
		return fmt.Errorf("router: SessionTimeout: must be >= 1s, got %s", c.SessionTimeout)
	case c.PartitionCheck <= 0:
		return fmt.Errorf("router: PartitionCheck: must be > 0, got %s", c.PartitionCheck)
	case c.WireFormat != registry.SingleObject && c.WireFormat != registry.Confluent:
		return fmt.Errorf("router: WireFormat: %q is not one of single-object, confluent", c.WireFormat)
	case c.WireFormat == registry.Confluent && c.Registry == nil:
		return errors.New("router: Registry: required with the confluent wire format (--registry-url)")
	}
	if c.GroupProtocol != "" && !slices.Contains(GroupProtocols, c.GroupProtocol) {
		return fmt.Errorf("router: GroupProtocol: must be one of %s, got %q", strings.Join(GroupProtocols, ", "), c.GroupProtocol)
	}
	if _, err := compressionCodec(c.Compression); err != nil {
		return fmt.Errorf("router: Compression: %w", err)
	}
	return nil
}

// Router routes task events. Build it with New and run it with Run. It
// runs the consumer group's sessions (runSession) and their assignment
// callbacks (onAssigned, onRevoked, onLost: the partitions it owns), and
// routes each polled batch through its parts (handle).
type Router struct {
	cfg     Config
	log     *slog.Logger
	lines   *logging.Lines // the decision lines of a batch (countCommitted); the handle goroutine's
	codec   *codec.Codec
	store   *store.Store
	metrics *metrics
	brk     *hold.Breakers // breaker holding (package hold); used by the handle goroutine only
	// fwd is the forwarding of misplaced input and the partition counts
	// (package forward)
	fwd *forward.Forwarder
	// rst restores the store of the partitions assigned (package restore); used
	// by the assignment callbacks
	rst *restore.Restorer
	// limits are the record size limits per topic, read when a session
	// starts (package refuse); used by the handle goroutine
	limits *refuse.Limits
	// unw are the inputs whose routed records cannot be written (package
	// refuse); used by the handle goroutine only
	unw *refuse.Refusals
	// dec decodes a batch's records and norm rewrites those in the
	// Confluent wire format first (package decode); used by the handle
	// goroutine
	dec  *decode.Decoder
	norm decode.Normalizer
	// swp is expiry and the sweep over the time indexes (package sweep);
	// used by the handle goroutine only
	swp *sweep.Sweeper

	mu    sync.Mutex
	owned map[int32]bool // ingress partitions this instance owns
	// ownedGen is the group generation owned was assigned in (-1: none):
	// a transaction of another generation is aborted (txn.Fence)
	ownedGen int32
	// syncs is this member's assignment of the group's last sync
	// (balancer.go), for the assignment callback
	syncs syncLog

	// written is held while the Pebble write of a committed batch runs
	// (handle.go); writeErr is that write's error, set before written is
	// released
	written  writeLock
	writeErr error
	// writing is the committed batch whose write may still run, for the
	// next batch to read its states from (handle.go); used by the handle
	// goroutine only
	writing *batch
	// rebalances counts the assignment callbacks run (onAssigned, onRevoked,
	// onLost): a batch committed before one of them may hold states a
	// restore has since replaced (statesBefore)
	rebalances atomic.Uint64
	// knownMembers are the group's static members at the last
	// assignment (membership.go); only the assignment callback uses it.
	knownMembers map[string]bool

	ready atomic.Bool
	// rejoining is set while a cooperative member rejoins the group: from
	// the end of a group session (onRevoked) to the next assignment
	// (onAssigned); a commit waits for it (awaitJoined)
	rejoining atomic.Bool
	// revokedFirst is set by a cooperative session that began with a
	// revoke: franz-go rejoins right after its assignment
	revokedFirst atomic.Bool
	// revokedInTxn is set by a revoke of partitions (onRevoked) and cleared
	// as a transaction ends: franz-go's session aborts the transaction a
	// revoke came in, so its end need not wait for the rejoin (end)
	revokedInTxn atomic.Bool
	// registryDown is set while a batch waits for the schema registry
	// (registry.go): the router is not ready meanwhile
	registryDown atomic.Bool

	// framer writes the Confluent wire format (registry.go); nil for the
	// single-object encoding. Set before the first session.
	framer *registry.Framer
	// out builds the output records (package emit), in framer's format
	out *emit.Records
}

// New validates cfg, opens the state store and returns a Router.
func New(cfg Config) (*Router, error) {
	d := Default()
	if cfg.Policy == nil {
		cfg.Policy = d.Policy
	}
	if cfg.Group == "" {
		cfg.Group = d.Group
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = d.InstanceID
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = d.MaxRecordBytes
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = d.MaxPollRecords
	}
	if cfg.MaxPollBytes == 0 {
		cfg.MaxPollBytes = d.MaxPollBytes
	}
	if cfg.MaxBatchRecords == 0 {
		cfg.MaxBatchRecords = max(d.MaxBatchRecords, cfg.MaxPollRecords)
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = max(d.MaxBatchBytes, cfg.MaxPollBytes)
	}
	if cfg.MaxBatchLatency == 0 {
		cfg.MaxBatchLatency = d.MaxBatchLatency
	}
	if cfg.Tick == 0 {
		cfg.Tick = d.Tick
	}
	if cfg.TransactionTimeout == 0 {
		cfg.TransactionTimeout = d.TransactionTimeout
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = d.SessionTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Logger
	}
	if cfg.Now == nil {
		cfg.Now = d.Now
	}
	if cfg.PartitionCheck == 0 {
		cfg.PartitionCheck = d.PartitionCheck
	}
	if cfg.WireFormat == "" {
		cfg.WireFormat = d.WireFormat
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// with a registry, every routed record is the current version: the
	// subjects hold it alone, and their readers resolve by its ID
	c, err := codec.NewWith(codec.Options{CurrentRoutedOnly: cfg.WireFormat == registry.Confluent})
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "router", "instance", cfg.InstanceID)
	brk, err := hold.New(cfg.Policy, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	so := store.Options{ExpiryBucket: expiryBucket(cfg.Policy)}
	if cfg.storeOptions != nil {
		cfg.storeOptions(&so)
	}
	st, err := store.OpenWith(cfg.StateDir, cfg.Logger, so)
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:      cfg,
		log:      log,
		codec:    c,
		store:    st,
		metrics:  newMetrics(cfg.Registerer),
		owned:    map[int32]bool{},
		ownedGen: -1,
	}
	r.out = emit.New(c, log)
	r.attachBreakers(brk)
	r.fwd = forward.New(cfg.Topics, cfg.PartitionCheck, log, forward.Metrics{Partitions: r.metrics.partitions, Changes: r.metrics.partitionChanges},
		func(out forward.Out, now time.Time, kind string, e event.BreakerEvent) {
			r.brk.Alert(out, now, kind, e)
		})
	r.rst = restore.New(restore.Config{Topic: cfg.Topics.State, ClientOpts: cfg.ClientOpts, TransactionTimeout: cfg.TransactionTimeout,
		Store: st, Log: log, Metrics: r.metrics.restore})
	r.unw = refuse.New(cfg.Topics, log, r.ownedSet)
	r.dec = r.decoder()
	r.norm = decode.Normalizer{Registry: cfg.Registry, Log: log, Waiting: r.registryWaiting}
	r.swp = sweep.New(cfg.Policy, cfg.Topics.State, log, st, owner{r}, r.alertFunc())
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "faultrouter", Name: "store_background_errors_total",
			Help: "Flushes and compactions of the state store that failed (a full disk stops the router: see Run)."},
			func() float64 { return float64(st.BackgroundErrors()) }))
	}
	return r, nil
}

// alertFunc is the sweep's way to the alerts topic: the breakers' alerts.
func (r *Router) alertFunc() sweep.AlertFunc {
	return func(b sweep.Batch, now time.Time, kind string, e event.BreakerEvent) { r.brk.Alert(b, now, kind, e) }
}

// attachBreakers makes brk the router's breakers (package hold), with the
// router's logger, codec, instance, topics, store and assignment.
func (r *Router) attachBreakers(brk *hold.Breakers) {
	brk.Attach(hold.Deps{Log: r.log, Codec: r.codec, Instance: r.cfg.InstanceID, Topics: r.cfg.Topics, Store: r.store, Owner: owner{r},
		Home: func(key []byte) int32 { return r.fwd.HomePartition(key) }})
	brk.SetFramer(r.framer)
	r.brk = brk
}

// expiryBucket is the width of the store's expiry buckets for a policy: a
// 24th of the default state TTL (2 x default_sla_ms), between a second and
// an hour. The default policy's is an hour; a policy whose durations are
// divided by a factor, to pass days of a task's life in minutes, gets
// buckets as short, so that its tasks are forgotten on the same scale.
func expiryBucket(p *policy.Policy) time.Duration {
	d := time.Duration(2*p.DefaultSLAMs/24) * time.Millisecond
	return min(max(d, time.Second), store.DefaultExpiryBucket)
}

// Ready reports whether the router has restored its state and is routing:
// not while it waits for a schema registry that does not answer, nor while
// its assignment waits for the breakers topic to be read (catchUpTable),
// nor once its state store failed.
func (r *Router) Ready() bool {
	return r.ready.Load() && !r.registryDown.Load() && r.brk.Current() && (r.store == nil || r.store.Err() == nil)
}

// Run routes until ctx is done. A failed transactional session (fenced,
// ambiguous commit, lost group) is closed and a new one is created, so the
// producer is re-created after an ambiguous transaction error. A state
// store that can no longer be written (its disk full: store.Err) ends the
// session, which leaves the group so that the other instances take its
// partitions at once, and Run returns the store's error: Pebble would
// retry its flush for as long as the disk stays full, while every write
// waits. The changelog holds every committed state; a restart on a disk
// with room restores the store from it.
func (r *Router) Run(ctx context.Context) error {
	defer r.store.Close()
	if err := r.prepareFramer(ctx); err != nil { // registry.go
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := r.brk.StartTable(ctx, r.cfg.ClientOpts); err != nil { // package hold
		return nil // ctx ended
	}
	backoff := 100 * time.Millisecond
	for {
		err := r.runSession(ctx)
		if ctx.Err() != nil {
			r.leaveStatic()
			return nil
		}
		if ferr := r.store.Err(); ferr != nil {
			// the session ended and left the group: the other instances
			// take its partitions at once, and restore them from the
			// changelog, which holds every state this one committed
			r.setReady(false)
			r.leaveStatic()
			return fmt.Errorf("router: stopped, its state store cannot be written: %w", ferr)
		}
		r.setReady(false)
		r.metrics.sessionRestarts.Inc()
		r.log.Warn("transactional session ended; starting a new one", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (r *Router) runSession(ctx context.Context) error {
	// A failed restore is reported here by the assignment callback, which
	// must not leave the group itself (that deadlocks in franz-go); the
	// loop below ends the session instead, which leaves the group, and Run
	// starts a new one that restores again.
	restoreFailed := make(chan error, 1)
	r.limits = refuse.Load(ctx, r.cfg.Topics, r.cfg.ClientOpts, r.log) // package refuse
	if err := r.fwd.Start(ctx, r.cfg.ClientOpts); err != nil {         // package forward
		return err
	}
	compression, _ := compressionCodec(r.cfg.Compression) // valid: New validated it
	opts := append([]kgo.Opt{}, r.cfg.ClientOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topics.Ingress, r.cfg.Topics.Decisions),
		kgo.TransactionalID(r.cfg.Group+"-"+r.cfg.InstanceID),
		kgo.TransactionTimeout(r.cfg.TransactionTimeout),
		kgo.SessionTimeout(r.cfg.SessionTimeout),
		kgo.HeartbeatInterval(heartbeatInterval(r.cfg.SessionTimeout)),
		// a member that joins after the group's metadata was read fetches
		// its new partitions' offsets and leaders at once, not after
		// franz-go's default five seconds between metadata reads
		kgo.MetadataMinAge(metadataMinAge),
		// and starts to fetch them at once: a fetch in flight when they are
		// assigned holds them back until it returns (see fetchMaxWait)
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// franz-go group consumers always fetch stable offsets (KIP-447): a
		// pending transactional offset commit is waited for, never skipped
		// co-partitioned: partition p of ingress and decisions together, also
		// while their counts differ; cooperative (when configured) once every
		// member offers it, else eager, "range" for the oldest members
		// (balancer.go)
		kgo.Balancers(balancers(&r.syncs, r.cfg.GroupProtocol != "eager")...),
		kgo.RecordPartitioner(forward.NewPartitioner(r.cfg.Topics.State, r.cfg.Topics.Decisions, r.cfg.Topics.Ingress, r.cfg.Topics.Breakers)),
		kgo.ProducerBatchMaxBytes(int32(r.limits.BatchMax)),
		kgo.ProducerBatchCompression(compression),
		kgo.FetchMaxBytes(int32(r.cfg.MaxPollBytes)),
		kgo.FetchMaxPartitionBytes(int32(max(fetchPartitionBytes, r.cfg.MaxRecordBytes))),
		kgo.RetryBackoffFn(retryBackoff),
		// a batch's output (audit, state and routed records) is buffered
		// whole before the flush that ends its transaction
		kgo.MaxBufferedRecords(max(10_000, 4*r.cfg.MaxBatchRecords)),
		kgo.OnPartitionsAssigned(func(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
			r.onAssigned(ctx, cl, assigned, restoreFailed)
		}),
		kgo.OnPartitionsRevoked(r.onRevoked),
		kgo.OnPartitionsLost(r.onLost),
	)
	if r.metrics.kprom != nil {
		opts = append(opts, kgo.WithHooks(r.metrics.kprom))
	}
	if r.cfg.StaticMembership {
		opts = append(opts, kgo.InstanceID(r.cfg.InstanceID))
	}
	// The next session restores into the store, and Run closes it: the last
	// batch's write is waited for once closeSession (below) has aborted any
	// open transaction, which a restore running meanwhile may wait for.
	defer func() {
		if err := r.waitWritten(); err != nil && !errors.Is(err, store.ErrUnwritable) { // that one was logged once (package store)
			r.log.Error("state store write of the last batch failed; the changelog restores it", "err", err)
		}
	}()
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return fmt.Errorf("router: client: %w", err)
	}
	defer r.closeSession(sess)
	// Initialize the transactional producer now, not at the first produce:
	// it fences a previous incarnation of this instance and aborts the
	// transaction that one left open, so the changelog's last stable offset
	// moves on and the restore of the assigned partitions need not wait for
	// the transaction timeout.
	if _, _, err := sess.Client().ProducerID(ctx); err != nil {
		return fmt.Errorf("router: init transactional producer: %w", err)
	}
	r.log.Info("router started", "group", r.cfg.Group, "ingress", r.cfg.Topics.Ingress, "decisions", r.cfg.Topics.Decisions)
	r.writing = nil                         // the last session's batches are written (waitWritten, deferred above)
	bs := [2]*batch{newBatch(), newBatch()} // one is written to the store while the other is handled
	sizer := newBatchSizer(&r.cfg)          // batchsize.go
	limit := sizer.base
	bctx, stopBatches := drainContext(ctx, drainTimeout) // a shutdown commits the batch in flight
	defer stopBatches()
	for n := 0; ; n++ {
		if beforePoll != nil {
			beforePoll()
		}
		b := bs[n%2]
		start := time.Now()
		pollCtx, cancel := context.WithTimeout(ctx, r.cfg.Tick)
		fetches := sess.PollRecords(pollCtx, limit.records)
		cancel()
		fetches = r.topUp(ctx, sess, fetches, limit, sizer.grown(limit), start)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fetches.IsClientClosed() {
			return errors.New("router: client closed")
		}
		// franz-go fetches newly assigned partitions only after the
		// callback returned, so a batch holding their records is never
		// routed on a state that failed to restore
		select {
		case err := <-restoreFailed:
			return fmt.Errorf("router: restore failed; leaving the group so that the partitions are assigned and restored again: %w", err)
		default:
		}
		if err := r.store.Err(); err != nil { // the disk under it is full (package store): Run stops
			return err
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				r.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		committed, err := r.handle(bctx, sess, fetches, b)
		if err != nil {
			return err
		}
		if committed {
			seen := batchSeen{lag: fetchLag(fetches), took: time.Since(start)}
			seen.records, seen.bytes = fetchSize(fetches)
			limit = sizer.next(limit, seen)
			r.metrics.observeBatch(seen, limit)
		}
	}
}

// drainTimeout bounds how long a batch polled before a shutdown goes on
// routing and committing after it (drainContext).
const drainTimeout = 5 * time.Second

// drainContext returns the context a batch is handled in: ctx without its
// end, ended drainTimeout after ctx ends. A batch polled before a shutdown
// (SIGTERM in a deploy) is routed and committed, not aborted: aborted, its
// records would wait for the partitions' next owner, through the
// rebalance and the restore, and be routed again. The loop polls no batch
// after ctx ended. stop releases the context's resources.
func drainContext(ctx context.Context, grace time.Duration) (bctx context.Context, stop func()) {
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unwatch := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return bctx, func() {
		unwatch()
		cancel()
	}
}

// beforePoll, when set, runs before each poll of the run loop: a test
// holds the loop there while the group rebalances. Nil in production.
var beforePoll func()

// fetchPartitionBytes bounds what one fetch takes from a partition (or the
// largest record routed, if larger): franz-go decompresses a fetch response
// whole and keeps it until every record in it is polled, so with its default
// of 1 MiB per partition a backlog on six partitions kept about six polls'
// worth of make bench's records (about 200 bytes each, compressed)
// decompressed in memory, the largest part of the router's heap besides the
// held retries. Half of that still holds three polls of MaxPollRecords. make
// bench's memory run, 1M tasks: RSS 452-500 MiB (peak 502-512) -> 390 (peak
// 395).
const fetchPartitionBytes = 512 << 10

// topUpWait bounds the second poll of a batch (topUp): about a fetch round
// trip to a broker that has the records already.
const topUpWait = 5 * time.Millisecond

// topUp adds to a poll's records those that reached the brokers while the
// previous batch was routed, so that they are not left for the batch after
// this one. franz-go keeps one fetch response per broker and sends the next
// fetch only once the previous one was polled; that fetch returns as soon as
// a record is there, early in a batch's work, so at light traffic a poll
// returned only the records of the first milliseconds of the previous batch
// and the rest waited a whole batch more. The poll that drained the buffered
// response has sent the next fetch, which returns at once with what arrived
// since: the second poll waits for it, at most topUpWait.
//
// Under a backlog (grown: the limit is above the light-load one) it polls
// again and again, each time for at most topUpWait, until the batch
// reaches its limit, a poll returns nothing or a quarter of
// MaxBatchLatency has passed since the batch's first poll (start): one
// fetch response per broker is one poll, and a grown batch is several, but
// records that trickle in must not hold a batch in its polls.
func (r *Router) topUp(ctx context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches, limit batchLimit, grown bool, start time.Time) kgo.Fetches {
	n, size := fetchSize(fetches)
	for n > 0 && n < limit.records && size < limit.bytes && !fetches.IsClientClosed() {
		if grown && time.Since(start) > r.cfg.MaxBatchLatency/4 {
			break
		}
		pctx, cancel := context.WithTimeout(ctx, topUpWait)
		more := sess.PollRecords(pctx, limit.records-n)
		cancel()
		m, b := fetchSize(more)
		fetches = append(fetches, more...)
		if m == 0 || !grown {
			break
		}
		n, size = n+m, size+b
	}
	return fetches
}

// retryBackoff is how long the session's client waits before retrying a
// failed request (a produce or fetch request that failed, a coordinator that
// moved): 10 ms, doubling up to 1 s, where franz-go's default waits at least
// 250 ms. It is not what a transaction that follows a commit closely waits
// for: since Kafka 4.0 (transactions v2) the broker retries such a
// transaction's first produce itself while it writes the previous commit
// markers (every add.partitions.to.txn.retry.backoff.ms, 20 ms by default),
// and franz-go retries a CONCURRENT_TRANSACTIONS answer to the end of a
// transaction after its own ConcurrentTransactionsBackoff (20 ms). A debug
// log of the bench's 500 events/s run showed neither answer reaching the
// client.
func retryBackoff(tries int) time.Duration {
	return min(10*time.Millisecond<<min(max(tries-1, 0), 7), time.Second)
}

// closeSession aborts the transaction a session may have left open (a
// shutdown or an error mid-batch) and closes it. An open transaction would hold
// the last stable offset of the changelog and of every output partition until
// the transaction timeout, and the next owner's restore waits for it.
func (r *Router) closeSession(sess *kgo.GroupTransactSession) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := sess.Client()
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		r.log.Warn("closing session: abort buffered records", "err", err)
	} else if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		r.log.Warn("closing session: abort the open transaction", "err", err)
	}
	sess.Close()
}
