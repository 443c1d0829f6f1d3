// Command bench measures faultrouter against the ceiling of what Kafka
// allows on the same broker, in one run (`make bench`):
//
//   - throughput: a backlog of events (three attempts per task, a realistic
//     mix of failure classes) is routed by the router, built with
//     router.New and the default policy exactly as `faultrouter run` builds
//     it, and copied by a raw transactional passthrough (one transaction per
//     poll, three output records per input, nothing else) from the same
//     backlog, twice: polling the router's light-load poll size, and
//     polling whatever its client has buffered; the ratio router/raw,
//     against the faster of the two, is the headline;
//   - latency: events produced at a steady rate (half the measured router
//     maximum, and 500 events/s), from each input record's timestamp to its
//     committed audit record, p50/p99/p99.9, next to the router's commit
//     interval over the same run (the mean time between two of its
//     commits; the goal is p99 <= commit interval + 25 ms); a run the
//     router falls behind is reported with the count of audit records not
//     read 30 s after it, and the next run waits until the router caught up;
//   - a join at half load: a second instance, with an empty state
//     directory, joins the router's group while events come at half the
//     router's maximum; the records each instance restores after the join,
//     against the changelog records of the partitions that moved (the
//     goal: the first instance restores about nothing, the joiner the moved
//     partitions' records);
//   - restore: the state changelog the run wrote, restored into an empty
//     state directory, against a plain read_committed read of the same
//     topic;
//   - the Kafka Streams peer (bench/streams-peer): the application a user
//     would write instead, with exactly_once_v2, a stream thread per core,
//     the router's commit interval and a RocksDB store with a changelog
//     behind its record cache, run on the same backlog under a fresh
//     application id right after the router's run; the ratio router/peer;
//   - memory: the resident set of a `faultrouter run` process holding
//     --rss-tasks live task states;
//   - a deploy and a crash (fleet.go): three `faultrouter run` processes,
//     static group members, at a steady rate (--fleet-rate): latency to
//     committed audit in a warm-up run on the fresh topics (reported, not
//     compared), in a run without disruption, over a rolling restart
//     (SIGTERM one, start it, wait until it is ready, the next), and when
//     one is killed with SIGKILL, with the time until the killed
//     instance's partitions are decided again beside the session timeout
//     (the work directory keeps each instance's log, fleet-ID.log, and
//     each run's events, fleet-RUN.latency.tsv: sent, read, latency,
//     partition);
//   - CPU an event on the backlog: the router's, each passthrough's (this
//     process's CPU over each run) and the peer's (its JVM's process CPU,
//     from /proc/<pid>/stat, over its measured run), the router's ratio to
//     each, and the router's heap allocations an event (runtime/metrics).
//
// It prints one table and writes it as JSON (--json). It starts the
// project's broker with integration/kafka.sh unless --brokers is given. Only
// ratios and figures are printed; nothing is asserted.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

type config struct {
	brokers     string
	tasks       int
	latencyDur  time.Duration
	joinDur     time.Duration
	lowRate     float64
	rssTasks    int
	routerBin   string
	jsonOut     string
	cpuProfile  string
	memProfile  string
	workDir     string
	partitions  int
	skipLatency bool
	peer        bool
	peerRouted  int
	peerWarmup  int
	// fleetDur, fleetRate and sessionTimeout shape the fleet runs
	// (fleet.go); fleetDur 0 skips them
	fleetDur       time.Duration
	groupProtocol  string // the fleet's --group-protocol; "": run's default
	fleetRate      float64
	sessionTimeout time.Duration
	// batchRecords and batchLatency override the router's MaxBatchRecords
	// and MaxBatchLatency when not 0
	batchRecords int
	batchLatency time.Duration
}

// tune applies the --max-batch-* flags to a router's config.
func (c config) tune(rc *router.Config) {
	if c.batchRecords > 0 {
		rc.MaxBatchRecords = max(c.batchRecords, rc.MaxPollRecords)
	}
	if c.batchLatency > 0 {
		rc.MaxBatchLatency = c.batchLatency
	}
}

func main() {
	var c config
	flag.StringVar(&c.brokers, "brokers", "", "bootstrap brokers; default: start integration/kafka.sh (FAULTROUTER_KAFKA_DIR, FAULTROUTER_KAFKA_PORT)")
	flag.IntVar(&c.tasks, "tasks", 100_000, "tasks in the backlog (three attempts each)")
	flag.DurationVar(&c.latencyDur, "latency", 10*time.Second, "duration of each steady-rate latency run")
	flag.DurationVar(&c.joinDur, "join", 9*time.Second, "duration of the half-load run a second instance joins a third into; 0 skips it")
	flag.Float64Var(&c.lowRate, "low-rate", 500, "the light-traffic latency run's rate, events/s")
	flag.IntVar(&c.rssTasks, "rss-tasks", 1_000_000, "live tasks for the memory measurement; 0 skips it")
	flag.StringVar(&c.routerBin, "router-bin", "", "faultrouter binary for the memory measurement; default: go build ./cmd/faultrouter")
	flag.StringVar(&c.jsonOut, "json", "bench-result.json", "where to write the results as JSON")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the router's backlog run to this file (NAME.cpu), one of the latency runs to NAME.latency.cpu and one of the restore to NAME.restore.cpu")
	flag.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile after the router's backlog run to this file, and one from before it to FILE.base (go tool pprof -base)")
	flag.StringVar(&c.workDir, "work-dir", "", "directory for state stores and logs; default: a temporary one")
	flag.IntVar(&c.partitions, "partitions", 6, "partitions of every topic")
	flag.BoolVar(&c.peer, "peer", true, "run the Kafka Streams peer (bench/streams-peer; needs mvn, java and javac)")
	flag.IntVar(&c.peerRouted, "peer-routed-percent", 45, "the share of input records the peer writes a routed record for, in percent")
	flag.IntVar(&c.peerWarmup, "peer-warmup", 30_000, "backlog records the peer's JVM is warmed up on, untimed, before its measured run")
	flag.StringVar(&c.groupProtocol, "group-protocol", "", "the fleet's group protocol, as faultrouter run's --group-protocol (eager, cooperative); default: run's default")
	flag.DurationVar(&c.fleetDur, "fleet", 10*time.Second, "three `faultrouter run` processes at --fleet-rate: the length of the steady run, and what the rolling-restart and SIGKILL runs add after their disruption; 0 skips them")
	flag.Float64Var(&c.fleetRate, "fleet-rate", 200, "the fleet runs' rate, events/s")
	flag.DurationVar(&c.sessionTimeout, "session-timeout", router.Default().SessionTimeout, "the fleet's --session-timeout")
	flag.IntVar(&c.batchRecords, "max-batch-records", 0, "the router's MaxBatchRecords (its batch bound under a backlog); 0: its default")
	flag.DurationVar(&c.batchLatency, "max-batch-latency", 0, "the router's MaxBatchLatency (its batch's latency bound under a backlog); 0: its default")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// result is everything one run measured.
type result struct {
	Date          string `json:"date"`
	Cores         int    `json:"cores"`
	GoVersion     string `json:"go"`
	Brokers       string `json:"brokers"`
	BacklogEvents int    `json:"backlog_events"`
	Tasks         int    `json:"tasks"`
	PollRecords   int    `json:"poll_records"`
	// RawPerSec is the raw passthrough with the router's poll size;
	// RawUncappedPerSec polls whatever its client has buffered.
	RawPerSec         float64 `json:"raw_events_per_s"`
	RawUncappedPerSec float64 `json:"raw_uncapped_events_per_s"`
	// RawBatch and RawUncappedBatch are their mean records per transaction.
	RawBatch         float64 `json:"raw_mean_batch_records"`
	RawUncappedBatch float64 `json:"raw_uncapped_mean_batch_records"`
	RouterPerSec     float64 `json:"router_events_per_s"`
	// RouterRatio is against the faster of the two passthroughs;
	// RouterOverCapped against the one with the router's poll size.
	RouterRatio      float64 `json:"router_over_raw"`
	RouterOverCapped float64 `json:"router_over_raw_capped"`
	// RouterBatch is the mean records per committed transaction of the
	// router's backlog run.
	RouterBatch float64 `json:"router_mean_batch_records"`
	// RouterCPU is the CPU of the router's backlog run, RawCPU and
	// RawUncappedCPU the passthroughs' on the same backlog (each run alone
	// in this process); the ratios are the router's CPU an event over each.
	RouterCPU      *cpuUse `json:"router_cpu,omitempty"`
	RawCPU         *cpuUse `json:"raw_cpu,omitempty"`
	RawUncappedCPU *cpuUse `json:"raw_uncapped_cpu,omitempty"`
	CPUOverRaw     float64 `json:"router_cpu_over_raw,omitempty"`
	CPUOverUncap   float64 `json:"router_cpu_over_raw_uncapped,omitempty"`
	// RouterAllocs is what the router's backlog run allocated on the Go
	// heap, an event each (runtime/metrics, this process).
	RouterAllocs *allocUse      `json:"router_allocs,omitempty"`
	Classes      map[string]int `json:"classes"`
	LatencyHalf  latencyResult  `json:"latency_half_load"`
	LatencyLow   latencyResult  `json:"latency_low_rate"`
	CommitMs     float64        `json:"mean_batch_ms"`
	// BacklogCommitMs is the router's commit interval in its backlog run:
	// the run's time over its transactions (the Kafka Streams peer's
	// commit.interval.ms)
	BacklogCommitMs float64       `json:"backlog_commit_interval_ms"`
	Join            *joinResult   `json:"join_half_load,omitempty"`
	Restore         restoreResult `json:"restore"`
	Peer            *peerResult   `json:"streams_peer,omitempty"`
	PeerSkipped     string        `json:"streams_peer_skipped,omitempty"`
	RSS             *rssResult    `json:"rss,omitempty"`
	Fleet           *fleetResult  `json:"fleet,omitempty"`
}

type latencyResult struct {
	Rate  float64 `json:"events_per_s"`
	N     int     `json:"samples"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	MaxMs float64 `json:"max_ms"`
	// CommitIntervalMs is the mean time between two commits of the router
	// during the run; the latency goal is p99 <= it + 25 ms.
	CommitIntervalMs float64 `json:"commit_interval_ms"`
	// Missing counts the events whose audit record was not read within 30 s
	// of the end of the run: the router fell behind, and the percentiles
	// leave them out.
	Missing int `json:"not_read_in_time"`
	// CPU is this process's (the router, the producer and the reader) and
	// the machine's over the run.
	CPU *cpuUse `json:"cpu,omitempty"`
}

type restoreResult struct {
	Records      int     `json:"records"`
	PlainPerSec  float64 `json:"plain_read_records_per_s"`
	PlainS       float64 `json:"plain_read_s"`
	RestoreS     float64 `json:"restore_s"`
	ReadyS       float64 `json:"start_to_ready_s"`
	RestorePerS  float64 `json:"restore_records_per_s"`
	RestoreRatio float64 `json:"restore_over_plain"`
	// PlainCPU and RestoreCPU are the CPU of the read and of the restore
	// (from the router's start to ready), a record each.
	PlainCPU   *cpuUse `json:"plain_read_cpu,omitempty"`
	RestoreCPU *cpuUse `json:"restore_cpu,omitempty"`
}

func run(ctx context.Context, c config, out io.Writer) error {
	if c.workDir == "" {
		d, err := os.MkdirTemp("", "faultrouter-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		c.workDir = d
	}
	if c.brokers == "" {
		b, stopBroker, err := startBroker(ctx)
		if err != nil {
			return err
		}
		defer stopBroker()
		c.brokers = b
	}
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(c.brokers, ",")...)}
	res := result{Date: time.Now().UTC().Format("2006-01-02"), Cores: runtime.NumCPU(), GoVersion: runtime.Version(),
		Brokers: c.brokers, Tasks: c.tasks, PollRecords: router.Default().MaxPollRecords}

	prefix := fmt.Sprintf("bench-%d.", time.Now().Unix())
	set, err := topicspec.Load(prefix)
	if err != nil {
		return err
	}
	set = set.WithPartitions(int32(c.partitions))
	topics := routerTopics(set)
	raw := [3]string{prefix + "raw.audit", prefix + "raw.state", prefix + "raw.routed"}
	peerOut := [2]string{prefix + "peer.audit", prefix + "peer.routed"}
	if err := createTopics(ctx, seeds, set, append(raw[:], peerOut[:]...), c.partitions); err != nil {
		return err
	}
	w, err := newWorkload(topics.Ingress, "bench", 1)
	if err != nil {
		return err
	}

	// the backlog, in ingress before anything consumes it
	pc, err := kgo.NewClient(append(append([]kgo.Opt{}, seeds...), kgo.MaxBufferedRecords(50_000))...)
	if err != nil {
		return err
	}
	step(out, "producing the backlog: %d tasks x 3 attempts", c.tasks)
	n, err := w.produce(ctx, pc, 0, c.tasks, 3)
	pc.Close()
	if err != nil {
		return err
	}
	res.BacklogEvents = n
	backlogEnds, err := endOffsets(ctx, seeds, topics.Ingress)
	if err != nil {
		return err
	}

	step(out, "raw transactional passthrough, %d records a poll", res.PollRecords)
	cpu0 := markCPU()
	if res.RawPerSec, res.RawBatch, err = passthrough(ctx, seeds, topics.Ingress, raw, prefix+"raw", n, res.PollRecords); err != nil {
		return err
	}
	res.RawCPU = cpu0.since(n)
	step(out, "raw transactional passthrough, uncapped (polls whatever is buffered)")
	cpu0 = markCPU()
	if res.RawUncappedPerSec, res.RawUncappedBatch, err = passthrough(ctx, seeds, topics.Ingress, raw, prefix+"raw-uncapped", n, 0); err != nil {
		return err
	}
	res.RawUncappedCPU = cpu0.since(n)

	step(out, "router, default policy")
	stateDir, err := tempDir(c.workDir, "state")
	if err != nil {
		return err
	}
	if c.memProfile != "" { // the allocations before the router's run, for pprof -base
		if err := writeMemProfile(c.memProfile + ".base"); err != nil {
			return err
		}
	}
	stopProfile, err := startProfile(c.cpuProfile)
	if err != nil {
		return err
	}
	cpu0, alloc0 := markCPU(), markAllocs()
	rt, _, err := startRouter(ctx, seeds, topics, prefix+"router", stateDir, c.tune)
	if err != nil {
		stopProfile()
		return err
	}
	took, err := rt.waitRouted(ctx, n)
	stopProfile()
	res.RouterCPU, res.RouterAllocs = cpu0.since(n), alloc0.since(n)
	if res.RawCPU.PerEventUs > 0 && res.RawUncappedCPU.PerEventUs > 0 {
		res.CPUOverRaw = res.RouterCPU.PerEventUs / res.RawCPU.PerEventUs
		res.CPUOverUncap = res.RouterCPU.PerEventUs / res.RawUncappedCPU.PerEventUs
	}
	if err != nil {
		rt.stop()
		return err
	}
	if err := writeMemProfile(c.memProfile); err != nil {
		rt.stop()
		return err
	}
	res.RouterPerSec = float64(n) / took.Seconds()
	res.RouterRatio = res.RouterPerSec / max(res.RawPerSec, res.RawUncappedPerSec)
	res.RouterOverCapped = res.RouterPerSec / res.RawPerSec
	res.Classes = rt.routedByClass()
	batches := rt.counter("faultrouter_transactions_committed_total")
	if batches > 0 {
		res.CommitMs = rt.counter("faultrouter_batch_seconds") / batches * 1000
		res.RouterBatch = rt.counter("faultrouter_records_consumed_total") / batches
		res.BacklogCommitMs = ms(took) / batches
	}

	// the Kafka Streams peer on the same backlog, right after the router's
	// run, so that both see the machine as alike as it can be; the router
	// idles meanwhile (nothing more comes into ingress until the latency runs)
	if err := runPeer(ctx, c, out, &res, seeds, topics.Ingress, backlogEnds, peerOut, prefix+"peer"); err != nil {
		rt.stop()
		return err
	}

	next := c.tasks
	// the latency runs' profile: a steady rate of fresh tasks, with retries
	// held behind the breakers the workload's timeouts open
	if c.latencyDur > 0 {
		if stopProfile, err = startProfile(strings.TrimSuffix(c.cpuProfile, ".cpu") + ".latency.cpu"); err != nil {
			rt.stop()
			return err
		}
	}
	for _, l := range []struct {
		dst  *latencyResult
		rate float64
	}{{&res.LatencyLow, c.lowRate}, {&res.LatencyHalf, res.RouterPerSec / 2}} { // light load first: the retries that half load schedules would come due in it
		if c.latencyDur <= 0 {
			break
		}
		step(out, "latency at %.0f events/s for %s", l.rate, c.latencyDur)
		tx0, t0, cpu0 := rt.counter("faultrouter_transactions_committed_total"), time.Now(), markCPU()
		p, err := latency(ctx, seeds, w, topics.Audit, next, l.rate, c.latencyDur)
		if err != nil {
			rt.stop()
			return err
		}
		next += int(l.rate*c.latencyDur.Seconds()) + 1
		*l.dst = latencyResult{Rate: l.rate, N: p.N, P50: ms(p.P50), P99: ms(p.P99), P999: ms(p.P999), MaxMs: ms(p.Max), Missing: p.Missing,
			CPU: cpu0.since(int(l.rate * c.latencyDur.Seconds()))}
		// the commit interval: the mean time between two of the router's
		// commits over the run (README, "commit interval")
		if tx := rt.counter("faultrouter_transactions_committed_total") - tx0; tx > 0 {
			l.dst.CommitIntervalMs = ms(time.Since(t0)) / tx
		}
		if p.Missing > 0 { // the next run starts on a router that has caught up
			if err := rt.waitCaughtUp(ctx); err != nil {
				rt.stop()
				return err
			}
		}
	}
	stopProfile()

	// a second instance joins at half load; both stop before the restore
	// run, which starts one instance in the same group
	var joiner *runningRouter
	if c.joinDur > 0 {
		rate := res.RouterPerSec / 2
		step(out, "a second instance joins at %.0f events/s (a %s run)", rate, c.joinDur)
		j, jr, err := joinAtHalfLoad(ctx, out, c, seeds, topics, w, rt, prefix+"router", next, rate, c.joinDur)
		joiner = jr
		if err != nil {
			stopAll(rt, joiner)
			return err
		}
		res.Join = &j
		next += int(rate*c.joinDur.Seconds()) + 1
	}
	if err := stopAll(rt, joiner); err != nil {
		return fmt.Errorf("router: %w", err)
	}

	step(out, "restore from an empty state directory vs a plain read of the changelog")
	cpu0 = markCPU()
	recs, plain, err := plainRead(ctx, seeds, topics.State)
	if err != nil {
		return err
	}
	plainCPU := cpu0.since(recs)
	empty, err := tempDir(c.workDir, "state-empty")
	if err != nil {
		return err
	}
	stopProfile, err = startProfile(strings.TrimSuffix(c.cpuProfile, ".cpu") + ".restore.cpu")
	if err != nil {
		return err
	}
	cpu0 = markCPU()
	rt2, ready, err := startRouter(ctx, seeds, topics, prefix+"router", empty, c.tune)
	stopProfile()
	if err != nil {
		return err
	}
	restored := rt2.counter("faultrouter_restore_records_total")
	restoreCPU := cpu0.since(int(restored))
	restoreS := rt2.counter("faultrouter_restore_seconds")
	if err := rt2.stop(); err != nil {
		return err
	}
	res.Restore = restoreResult{Records: recs, PlainS: plain.Seconds(), PlainPerSec: float64(recs) / plain.Seconds(),
		RestoreS: restoreS, ReadyS: ready.Seconds(), PlainCPU: plainCPU, RestoreCPU: restoreCPU}
	if restoreS > 0 && recs > 0 {
		res.Restore.RestorePerS = restored / restoreS
		res.Restore.RestoreRatio = res.Restore.RestorePerS / res.Restore.PlainPerSec
	}

	bin := c.routerBin
	if bin == "" && (c.rssTasks > 0 || c.fleetDur > 0) {
		bin = filepath.Join(c.workDir, "faultrouter")
		b := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./cmd/faultrouter")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("build the router (run from the repository root or pass --router-bin): %w", err)
		}
	}
	if c.fleetDur > 0 {
		fr, err := runFleet(ctx, out, c, seeds, bin, c.fleetRate, c.fleetDur)
		if err != nil {
			return err
		}
		res.Fleet = &fr
	}

	if c.rssTasks > 0 {
		step(out, "memory of `faultrouter run` with %d live tasks", c.rssTasks)
		r, err := rss(ctx, bin, c.brokers, seeds, fmt.Sprintf("bench-rss-%d.", time.Now().Unix()), c.workDir, c.rssTasks)
		if err != nil {
			return err
		}
		res.RSS = &r
	}

	printTable(out, &res)
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "\nwritten to %s\n", c.jsonOut)
	}
	return nil
}

// stopAll stops the running routers together (nil ones are skipped), so
// that none takes over the partitions of another that leaves, and returns
// the first error.
func stopAll(rs ...*runningRouter) error {
	for _, r := range rs {
		if r != nil {
			r.cancel()
		}
	}
	var first error
	for _, r := range rs {
		if r == nil {
			continue
		}
		if err := <-r.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func step(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "== "+format+"\n", args...)
}

func printTable(out io.Writer, r *result) {
	fmt.Fprintf(out, "\nfaultrouter bench, %s, %d cores, %s, broker %s\n", r.Date, r.Cores, r.GoVersion, r.Brokers)
	fmt.Fprintf(out, "backlog: %d events (%d tasks x 3 attempts); the router polls up to %d records, more under a backlog\n\n", r.BacklogEvents, r.Tasks, r.PollRecords)
	row := func(what, figure, ratio string) { fmt.Fprintf(out, "| %-58s | %-24s | %-12s |\n", what, figure, ratio) }
	row("measure", "figure", "ratio")
	fmt.Fprintf(out, "|%s|%s|%s|\n", strings.Repeat("-", 60), strings.Repeat("-", 26), strings.Repeat("-", 14))
	row(fmt.Sprintf("raw transactional passthrough, %d records a poll", r.PollRecords), fmt.Sprintf("%.0f events/s", r.RawPerSec),
		fmt.Sprintf("%.2f", r.RawPerSec/max(r.RawPerSec, r.RawUncappedPerSec)))
	row("raw transactional passthrough, uncapped poll", fmt.Sprintf("%.0f events/s", r.RawUncappedPerSec),
		fmt.Sprintf("%.2f", r.RawUncappedPerSec/max(r.RawPerSec, r.RawUncappedPerSec)))
	row("  its mean records per transaction", fmt.Sprintf("%.0f records", r.RawUncappedBatch), "")
	row("router, default policy (ratio: over the faster raw)", fmt.Sprintf("%.0f events/s", r.RouterPerSec), fmt.Sprintf("%.2f", r.RouterRatio))
	row("  router over the raw passthrough with its poll size", "", fmt.Sprintf("%.2f", r.RouterOverCapped))
	row("router, mean time per batch (poll to committed state)", fmt.Sprintf("%.1f ms", r.CommitMs), "")
	row("router, mean records per transaction; commit interval", fmt.Sprintf("%.0f records", r.RouterBatch), fmt.Sprintf("%.1f ms", r.BacklogCommitMs))
	if r.RouterCPU != nil {
		row("  CPU: the router's, an event; the machine's", cpuRow(r.RouterCPU), "")
	}
	if r.RawCPU != nil && r.RawUncappedCPU != nil {
		row("  CPU an event, router over raw (its poll size; uncapped)",
			fmt.Sprintf("%.1f; %.1f µs raw", r.RawCPU.PerEventUs, r.RawUncappedCPU.PerEventUs), fmt.Sprintf("%.2f; %.2f", r.CPUOverRaw, r.CPUOverUncap))
	}
	if a := r.RouterAllocs; a != nil {
		row("  allocations an event, the router's backlog run", fmt.Sprintf("%.1f (%.0f bytes)", a.ObjectsPerEvent, a.BytesPerEvent), "")
	}
	for _, l := range []struct {
		name string
		l    latencyResult
	}{{"half load", r.LatencyHalf}, {"light load", r.LatencyLow}} {
		if l.l.N == 0 {
			continue
		}
		row(fmt.Sprintf("latency to committed audit, %s (%.0f events/s)", l.name, l.l.Rate),
			fmt.Sprintf("p50 %.0f, p99 %.0f ms", l.l.P50, l.l.P99), fmt.Sprintf("p99.9 %.0f ms", l.l.P999))
		if l.l.Missing > 0 {
			row("  falls behind: audit records not read 30 s after the run", fmt.Sprintf("%d", l.l.Missing), "")
		}
		row("  commit interval in that run (goal: p99 <= it + 25 ms)",
			fmt.Sprintf("%.1f ms", l.l.CommitIntervalMs), fmt.Sprintf("p99 - it: %.0f", l.l.P99-l.l.CommitIntervalMs))
		if l.l.CPU != nil {
			row("  CPU: router, producer and reader, an event; the machine's", cpuRow(l.l.CPU), "")
		}
	}
	if j := r.Join; j != nil {
		row(fmt.Sprintf("join at half load (%.0f events/s): restored by the first", j.Rate),
			fmt.Sprintf("%.0f records", j.RestoredFirst), fmt.Sprintf("%d restores", j.FirstRestores))
		row(fmt.Sprintf("  by the joiner (partitions %v; ratio: over moved)", j.Moved),
			fmt.Sprintf("%.0f records", j.RestoredJoiner), fmt.Sprintf("%.2f", j.RestoredOverMove))
		row("  changelog records of the moved partitions; of all",
			fmt.Sprintf("%d; %d", j.MovedRecords, j.ChangelogRecords), fmt.Sprintf("ready %.1f s", j.JoinerReadyS))
		if j.Behind {
			row("  falls behind: not caught up 30 s after the run", "", "")
		}
	}
	row(fmt.Sprintf("plain read_committed read of the changelog (%d records)", r.Restore.Records),
		fmt.Sprintf("%.0f records/s", r.Restore.PlainPerSec), "1")
	row("restore into an empty state directory",
		fmt.Sprintf("%.0f records/s (%.2f s)", r.Restore.RestorePerS, r.Restore.RestoreS), fmt.Sprintf("%.2f", r.Restore.RestoreRatio))
	if r.Restore.PlainCPU != nil && r.Restore.RestoreCPU != nil {
		row("  CPU a record: the plain read's; the restore's (start to ready)",
			fmt.Sprintf("%.1f; %.1f µs", r.Restore.PlainCPU.PerEventUs, r.Restore.RestoreCPU.PerEventUs),
			fmt.Sprintf("busy %.0f%%; %.0f%%", 100*r.Restore.PlainCPU.MachineBusy, 100*r.Restore.RestoreCPU.MachineBusy))
	}
	if r.Peer != nil {
		row("Kafka Streams peer, same backlog (ratio: router/peer)",
			fmt.Sprintf("%.0f events/s", r.Peer.PerSec), fmt.Sprintf("%.2f", r.Peer.RouterOver))
		if r.Peer.CPUPerEventUs > 0 {
			row("  CPU an event: the peer's JVM, its run (ratio: router/peer)",
				fmt.Sprintf("%.1f µs", r.Peer.CPUPerEventUs), fmt.Sprintf("%.2f", r.Peer.RouterCPUOver))
			row("  the peer's JVM from launch to exit (start-up, warm-up)", fmt.Sprintf("%.1f µs", r.Peer.WholeCPUPerEventUs), "")
		}
	}
	if f := r.Fleet; f != nil {
		row(fmt.Sprintf("three `faultrouter run`, %.0f events/s: latency, warm-up", f.Rate),
			fmt.Sprintf("p99 %.0f, max %.0f ms", f.Warmup.P99, f.Warmup.MaxMs), "")
		row("  steady, after the warm-up",
			fmt.Sprintf("p99 %.0f, max %.0f ms", f.Steady.P99, f.Steady.MaxMs), "")
		row("  over a rolling restart (ratio: p99 over steady's)",
			fmt.Sprintf("p99 %.0f, max %.0f ms", f.Restart.P99, f.Restart.MaxMs), fmt.Sprintf("%.2f", f.RestartP99Over))
		row("  each instance, SIGTERM to ready again", secondsList(f.RestartS), "")
		row(fmt.Sprintf("  SIGKILL of one (partitions %v): latency", f.KilledPartitions),
			fmt.Sprintf("p99 %.0f, max %.0f ms", f.Kill.P99, f.Kill.MaxMs), "")
		row(fmt.Sprintf("  its partitions decided again after (session timeout %.0f s)", f.SessionTimeoutS),
			fmt.Sprintf("%.1f s", f.DecidedAgainS), fmt.Sprintf("%+.1f s", f.OverSessionS))
		for _, l := range []latencyResult{f.Warmup, f.Steady, f.Restart, f.Kill} {
			if l.Missing > 0 {
				row("  a fleet run fell behind: audit records not read 30 s after it", fmt.Sprintf("%d", l.Missing), "")
			}
		}
	}
	if r.RSS != nil {
		row(fmt.Sprintf("`faultrouter run` RSS with %d live tasks", r.RSS.Tasks),
			fmt.Sprintf("%.0f MiB (peak %.0f)", r.RSS.RSSMiB, r.RSS.PeakRSSMiB), "")
	}
}

// startBroker starts the project's broker with integration/kafka.sh and
// returns its address and a function that stops it.
func startBroker(ctx context.Context) (string, func(), error) {
	env := os.Environ()
	if os.Getenv("FAULTROUTER_KAFKA_DIR") == "" {
		env = append(env, "FAULTROUTER_KAFKA_DIR="+filepath.Join(os.TempDir(), "faultrouter-bench-kafka"))
	}
	if os.Getenv("FAULTROUTER_KAFKA_PORT") == "" {
		env = append(env, "FAULTROUTER_KAFKA_PORT=19392")
	}
	script := filepath.Join("integration", "kafka.sh")
	cmd := exec.CommandContext(ctx, script, "start")
	cmd.Env, cmd.Stderr = env, os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("%s start (run from the repository root or pass --brokers): %w", script, err)
	}
	stop := func() {
		s := exec.Command(script, "stop")
		s.Env, s.Stderr = env, os.Stderr
		s.Run()
	}
	return strings.TrimSpace(string(b)), stop, nil
}

// createTopics creates the router's topics from the specs and the
// passthrough's output topics.
func createTopics(ctx context.Context, seeds []kgo.Opt, set topicspec.Set, extra []string, partitions int) error {
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := set.Ensure(ctx, adm, nil); err != nil {
		return err
	}
	resp, err := adm.CreateTopics(ctx, int32(partitions), 1, nil, extra...)
	if err != nil {
		return err
	}
	for _, t := range resp.Sorted() {
		if t.Err != nil {
			return fmt.Errorf("create %s: %w", t.Topic, t.Err)
		}
	}
	// wait until every partition has a leader, so that neither contender
	// starts its clock on topics the cluster is still setting up
	all := append(set.Names(), extra...)
	for {
		ends, err := adm.ListEndOffsets(ctx, all...)
		ok := err == nil
		if ok {
			ends.Each(func(o kadm.ListedOffset) { ok = ok && o.Err == nil })
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func newWorkload(topic, prefix string, seed uint64) (*workload, error) {
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	return &workload{codec: c, topic: topic, prefix: prefix, seed: seed}, nil
}

func startProfile(file string) (func(), error) {
	if file == "" || strings.HasPrefix(file, ".") { // no --cpuprofile: ".restore.cpu", ".latency.cpu"
		return func() {}, nil
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func writeMemProfile(file string) error {
	if file == "" {
		return nil
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

// endOffsets returns the end offset of every partition of topic.
func endOffsets(ctx context.Context, seeds []kgo.Opt, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, ends.Error()
}

// secondsList formats durations in seconds, one decimal each.
func secondsList(ss []float64) string {
	parts := make([]string, len(ss))
	for i, v := range ss {
		parts[i] = fmt.Sprintf("%.1f", v)
	}
	return strings.Join(parts, ", ") + " s"
}
