package integration

import (
	"context"
	encbinary "encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// The reference-model checker under faults: a seeded workload of every class
// (checker_workload_test.go) is produced while router instances are killed,
// paused past their session timeout, scaled 1 -> 3 -> 1, the broker
// restarts and a restore fails; then every committed output is recomputed
// from the committed inputs with the default policy, breakers on
// (internal/checker), and must match exactly.

// checkerConfig is one checker run.
type checkerConfig struct {
	seed     uint64
	tasks    int
	duration time.Duration // stream time the tasks start within
	faults   bool          // inject the faults (the self-test runs without)
	// binary is the router binary; default the one TestMain built
	binary string
	// noSettle checks once, without waiting for held retries to come out
	noSettle bool
	// compressed runs the routers and the model on the default policy with
	// every duration divided by FAULTROUTER_TIME_FACTOR (compress_test.go),
	// and the workload with the long paths of a task's life
	compressed bool
	// set gives durations of the compressed policy their value instead, by
	// key (compressedPolicy)
	set map[string]int64
	// schedule, when set, replaces the faults: it runs while the workload
	// streams and returns the names of what it did
	schedule func(c *cluster, began time.Time, produced *atomic.Int64) []string
	// routerArgs are extra flags of every router instance
	routerArgs []string
	// unwritable adds task events too large for the router's output topics
	// but not for ingress (the routers run with --max-record-bytes 1 MiB):
	// each must be dead-lettered at stage write, and its partition route on
	unwritable bool
	// previous is a build of the previous release that some instances run:
	// its latches follow other rules, so the latch checks leave out the
	// times it runs (checker.Options.SharesLatches)
	previous string
	// returns runs, once the outputs settled, the quiet stretch in which
	// tasks expire and come back and the instance restores from the
	// changelog (cluster.returns); the outputs are then checked again
	returns bool
	// partitionsChange: the schedule adds partitions, so the model cannot
	// tell a task's partition from its key (checker.Options.Partitions 0)
	// and takes the router's forwarded copies as what was misplaced
	partitionsChange bool
}

// schedule runs the steps of a checkerConfig.schedule at their times in
// the stream, logging each, and keeps their names.
type schedule struct {
	t        *testing.T
	began    time.Time
	produced *atomic.Int64
	done     []string
}

// at runs f, named name, d into the stream (at once when that has passed).
func (s *schedule) at(d time.Duration, name string, f func()) {
	if w := time.Until(s.began.Add(d)); w > 0 {
		time.Sleep(w)
	}
	start := time.Now()
	f()
	s.done = append(s.done, name)
	s.t.Logf("%s at stream %s (%d records produced), took %s", name, start.Sub(s.began).Round(100*time.Millisecond),
		s.produced.Load(), time.Since(start).Round(100*time.Millisecond))
}

// checkerResult is what one run found, for the summary table.
type checkerResult struct {
	cfg      checkerConfig
	rep      *checker.Report
	faults   []string
	took     time.Duration
	jsonPath string
	// stateCleaned and breakersCleaned are what the log cleaner removed of
	// the state changelog and the breakers topic during the run
	stateCleaned, breakersCleaned cleaned
	// storeTasks are the task states of the instances' stores compared
	// with the changelog after the run
	storeTasks int
}

// checkerSeed is FAULTROUTER_SEED, or a new random seed.
func checkerSeed(t *testing.T) uint64 {
	if s := os.Getenv("FAULTROUTER_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTROUTER_SEED=%q: want an unsigned integer", s)
		}
		return n
	}
	return rand.Uint64N(1_000_000_000)
}

// Guards the exactly-once contract as a user meets it, not as a count: with
// the default policy (breakers on), a seeded workload of >= 100,000 records
// over >= 40,000 tasks of every class, produced while the router is
// SIGKILLed, SIGSTOPped past its session timeout, scaled 1 -> 3 -> 1, the
// broker restarts and a restore fails, produces exactly the outputs that the
// policy computes from the committed input log, task by task: one audit
// record per input with the model's decision, every retry once and when due,
// every review, dead-letter and alert record and no other, breakers
// consistent with the audit stream, and a latch one of the three instances
// sets holding the retries of the other two. All of it while Kafka's log
// cleaner compacts the state changelog and the breakers topic under the
// routers (it must have removed records of the changelog); and once the
// routers stopped, every instance's Pebble store holds exactly what the
// compacted changelog says below its checkpoints. Breakers no one uses any
// more (a burst's model, action and template) are let go, their shared
// states tombstoned on the breakers topic; and in a quiet stretch at the
// end, tasks that expired and came back, their tombstone and new state side
// by side on the changelog, survive a restore from it (cluster.returns).
// openCooldown is the provider/model breakers' cooldown and window in the
// checker's runs: compressed as the rest of the policy (30 ms), an OPEN
// would end before another instance could read it, and
// breaker.open_everywhere would check nothing; a 1 s window (60 ms
// compressed) lets the home storm's failures, on one partition of three,
// trip the breaker of the instance that owns it.
var openCooldown = map[string]int64{"breakers.provider_model.cooldown_ms": 4000, "breakers.provider_model.window_ms": 1000}

func TestChecker(t *testing.T) {
	seed := checkerSeed(t)
	res := runChecker(t, checkerConfig{seed: seed, tasks: 54_000, duration: 50 * time.Second, faults: true, compressed: true, unwritable: true,
		set: openCooldown, returns: true})
	printSummary(os.Stdout, []checkerResult{res})
	if bad := unexpected(t, res.rep); len(bad) > 0 {
		t.Fatalf("the router's outputs differ from the model: %v (seed %d; JSON report %s)", bad, seed, res.jsonPath)
	}
	// breaker.latch_everywhere must have had something to check: templates
	// latched by a hallucination on one instance while retries of them came
	// due on another
	t.Logf("latches: %s", res.rep.Latch)
	if res.rep.Latch.Stretches == 0 || res.rep.Latch.HeldElsewhere == 0 {
		t.Fatalf("the run never had a retry of a latched template come due on another instance than the latch's (%s, seed %d): breaker.latch_everywhere checked nothing",
			res.rep.Latch, seed)
	}
	// and it must have checked RESETs made mid-run: one that ended items
	// written before it, and items written after one, which it must not end
	if res.rep.Latch.EndedByReset == 0 || res.rep.Latch.AboveReset == 0 {
		t.Fatalf("the run had no item ended by a RESET written after it, or none written after a RESET (%s, seed %d)", res.rep.Latch, seed)
	}
	// breaker.open_everywhere too: failure-rate OPENs whose cooldown outlasts
	// their reach, and retries of another instance they held
	t.Logf("OPEN states: %s", res.rep.Open)
	if res.rep.Open.Checked == 0 || res.rep.Open.Held == 0 {
		t.Fatalf("no OPEN of a failure-rate breaker held a retry of another instance (%s, seed %d): breaker.open_everywhere checked nothing", res.rep.Open, seed)
	}
	// breaker.shared_not_let_go too: the idle burst's breakers, left OPEN or
	// HALF_OPEN when nothing used them any more
	if res.rep.IdleShared == 0 {
		t.Fatalf("no breaker was left OPEN or HALF_OPEN by its last use for its idle time (seed %d): breaker.shared_not_let_go checked nothing", seed)
	}
	requireCleaned(t, res)
	if res.storeTasks == 0 {
		t.Errorf("no task state of the instances' stores was compared with the changelog (seed %d)", seed)
	}
}

// requireCleaned fails the test when the log cleaner removed nothing of the
// state changelog in a run of minutes (cleanerConfigs): the run did not
// route on a changelog compacted under it, as the topic's users do.
func requireCleaned(t *testing.T, res checkerResult) {
	t.Helper()
	if res.stateCleaned.removed() <= 0 {
		t.Errorf("the log cleaner removed nothing of the state changelog during the run (%s, seed %d)", res.stateCleaned, res.cfg.seed)
	}
}

// knownRouterBugs are checks the router fails today, each with what is
// wrong. The checker reports them (summary, text and JSON report) and the
// tests print them, but do not fail on them. Remove an entry once the router
// is fixed; a check that passes again is reported too.
var knownRouterBugs = map[string]string{}

// unexpected returns the checks with violations that are not known router
// bugs, and logs the known ones.
func unexpected(t *testing.T, rep *checker.Report) []string {
	var bad []string
	for check, n := range rep.ViolationsByCheck {
		if why, ok := knownRouterBugs[check]; ok {
			t.Logf("KNOWN ROUTER BUG, not failing the test: %d violations of %s: %s", n, check, why)
			continue
		}
		bad = append(bad, fmt.Sprintf("%s: %d", check, n))
	}
	// the first violations go into the test's output, so a failure on a
	// machine whose JSON report is gone still says what differed
	shown := 0
	for _, v := range rep.Violations {
		if _, ok := knownRouterBugs[v.Check]; ok || shown == 5 {
			continue
		}
		shown++
		t.Logf("violation %s (task %s): %s", v.Check, v.Task, v.Detail)
	}
	for check := range knownRouterBugs {
		if rep.ViolationsByCheck[check] == 0 {
			t.Logf("known router bug %s did not show in this run", check)
		}
	}
	return bad
}

// TestCheckerSoak runs TestChecker's round again and again, with seeds
// SEED, SEED+1, ..., for FAULTROUTER_SOAK_DURATION (`make soak DURATION=1h`),
// and prints one summary table. Skipped when the duration is unset.
func TestCheckerSoak(t *testing.T) {
	d := os.Getenv("FAULTROUTER_SOAK_DURATION")
	if d == "" {
		t.Skip("FAULTROUTER_SOAK_DURATION is unset (make soak sets it)")
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		t.Fatalf("FAULTROUTER_SOAK_DURATION=%q: %v", d, err)
	}
	seed := checkerSeed(t)
	var results []checkerResult
	began := time.Now()
	for round := 0; round == 0 || time.Since(began) < dur; round++ {
		s := seed + uint64(round)
		t.Run(fmt.Sprintf("seed-%d", s), func(t *testing.T) {
			res := runChecker(t, checkerConfig{seed: s, tasks: 54_000, duration: 50 * time.Second, faults: true, compressed: true, unwritable: true, set: openCooldown,
				returns: true})
			results = append(results, res)
			if bad := unexpected(t, res.rep); len(bad) > 0 {
				t.Errorf("the router's outputs differ from the model: %v (seed %d; JSON report %s)", bad, s, res.jsonPath)
			}
			requireCleaned(t, res)
		})
	}
	fmt.Printf("\nsoak: %d rounds in %s\n", len(results), time.Since(began).Round(time.Second))
	printSummary(os.Stdout, results)
}

// runChecker runs one workload against the router (with the faults), then
// checks every output against the model and writes the JSON report. The
// state changelog and the breakers topic are compacted while the routers
// run (cleanerConfigs); once the outputs are checked, the routers are
// stopped and each instance's Pebble store is compared with the changelog
// (checkStores).
func runChecker(t *testing.T, cfg checkerConfig) checkerResult {
	t.Helper()
	fmt.Printf("checker: workload seed %d (replay: make soak SEED=%d DURATION=1s)\n", cfg.seed, cfg.seed)
	t.Logf("workload seed %d", cfg.seed)
	began := time.Now()
	e := newEnv(t)
	bin := binary
	if cfg.binary != "" {
		bin = cfg.binary
	}
	pol := policy.Default()
	c := &cluster{t: t, e: e, bin: bin, args: cfg.routerArgs, dirs: map[string]string{}, routers: map[string]*router{}, processes: map[string][]*router{}, starts: map[string][]time.Time{}, stops: map[string][]time.Time{},
		bins: map[string][]string{}}
	if cfg.compressed {
		var path string
		path, pol = compressedPolicy(t, cfg.set)
		c.args = append([]string{"--policy", path}, c.args...)
		t.Logf("policy: the default policy, every duration divided by %d, except %v", timeFactor(t), cfg.set)
	}
	if cfg.unwritable {
		c.args = append(c.args, "--max-record-bytes", strconv.Itoa(maxInputBytes))
	}
	captureBreakers(t, e) // the checker's latches: the breakers topic as it is written
	c.start("a")
	// the cleaner under the routers, from before it may remove anything
	stateTopic, breakersTopic := e.prefix+"faultrouter.state", e.prefix+"faultrouter.breakers"
	watch := watchTopics(stateTopic, breakersTopic)
	defer watch.stop()
	tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	watch.caughtUp(tctx, t, time.Minute)
	compactWhileRouting(tctx, t, stateTopic, breakersTopic)
	tcancel()

	w := newWorkload(cfg.seed, cfg.tasks, cfg.duration, cfg.compressed)
	if cfg.unwritable {
		w.addUnwritable(6, maxInputBytes-32<<10)
	}
	t.Logf("workload: %d records, %d tasks, scenarios %v", len(w.items), w.tasks, w.scenario)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	var produced atomic.Int64
	done := make(chan error, 1)
	streamStart := time.Now()
	go func() { done <- produceItems(ctx, e.prefix, w.items, 3, streamStart, &produced) }()
	var faults []string
	switch {
	case cfg.schedule != nil:
		faults = cfg.schedule(c, streamStart, &produced)
	case cfg.faults:
		faults = c.inject(streamStart, &produced)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("produced %d records in %s", produced.Load(), time.Since(streamStart).Round(time.Millisecond))
	// ingress is written by workers alone; decisions also holds the
	// router's own breaker commands, whose transaction markers no consumer
	// commits past: that the router read all of it shows in the audit below
	if !waitFor(4*time.Minute, func() bool { return consumedAll(ctx, e, e.prefix+"ai.tasks.ingress") }) {
		t.Fatalf("the router did not consume every ingress record within 4 min; logs of a:\n%s", tailLines(c.routers["a"].logs.String(), 40))
	}

	opts := checker.Options{Policy: pol, Ingress: e.prefix + "ai.tasks.ingress", Decisions: e.prefix + "ai.tasks.review.decisions",
		Starts: c.starts, Stops: c.stops, Rebalances: c.rebalances, Partitions: 3}
	if cfg.unwritable {
		opts.MaxRecordBytes, opts.MaxOutputBytes = maxInputBytes, smallestOutputLimit(ctx, t, e)
		t.Logf("unwritable: %d task events of about %d KiB; the smallest output topic takes %d bytes", w.scenario["unwritable"], (maxInputBytes-32<<10)>>10, opts.MaxOutputBytes)
	}
	if cfg.partitionsChange {
		opts.Partitions = 0
	}
	if cfg.previous != "" {
		// a run that mixes in the previous release checks no latch: that
		// release orders latches by its writers' clocks, neither reads items
		// as latches nor writes them where this release orders them, and
		// applies resets when it reads their commands, and what it wrote
		// (its items' tombstones, by key on other partitions) stays on the
		// topic after it has gone (docs/breakers.md, Upgrades); routing,
		// retries, reviews and alerts are checked as in every run
		opts.SharesLatches = func(string, time.Time) bool { return false }
		// nor the cost ledger: that release claims cost prevented per stop
		// and names no repeated attempt on its audit records
		opts.MixedReleases = true
	}
	// check waits until every input has its audit record (the last ones may
	// be on their way), and, with retries, until no retry the model owes is
	// missing (held retries come out up to a cooldown after a reset)
	check := func(retries bool) *checker.Report {
		for deadline := time.Now().Add(2 * time.Minute); ; {
			rep, err := checker.Check(readLogs(ctx, t, e, retries || cfg.noSettle, watch), opts)
			if err != nil {
				t.Fatal(err)
			}
			audit, retry := rep.ViolationsByCheck["audit.missing"], rep.ViolationsByCheck["retry.missing"]
			if audit == 0 && (!retries || retry == 0) || time.Now().After(deadline) {
				return rep
			}
			t.Logf("%d audit records and %d retries not there yet; checking again in 5 s", audit, retry)
			time.Sleep(5 * time.Second)
		}
	}
	rep := check(false)
	if !cfg.noSettle {
		// the drain, once every input is routed: an operator resets every
		// breaker. The workload's workers never report a retry's outcome,
		// so a half-open breaker would wait forever for the success that
		// closes it, and hold its retries.
		// on every decisions partition: a schedule may have added some
		if err := produceItems(ctx, e.prefix, w.finalResets(0), partitionCount(ctx, t, e.prefix+"ai.tasks.review.decisions"), time.Now(), &produced); err != nil {
			t.Fatal(err)
		}
		rep = check(true)
		if cfg.returns {
			c.returns(ctx, w, watch, stateTopic, &produced)
			rep = c.idleSettled(ctx, w, &produced, func() *checker.Report { return check(true) })
			if rep.IdleShared == 0 {
				t.Logf("the idle bursts' breakers on the breakers topic:\n%s", idleBreakerTrail(capturedBreakers(ctx, t, e)))
			}
		}
	}
	res := checkerResult{cfg: cfg, rep: rep, faults: faults, took: time.Since(began)}
	res.jsonPath = writeReport(t, cfg.seed, rep)
	var text strings.Builder
	rep.WriteText(&text)
	t.Logf("checker (seed %d, JSON report %s):\n%s", cfg.seed, res.jsonPath, text.String())
	// which restores the run's assignments made, every process of each
	// instance: a partition caught up from its release mark, or restored
	// from the changelog's start after its local state was dropped
	for _, name := range slices.Sorted(maps.Keys(c.processes)) {
		caught, dropped := 0, 0
		for _, r := range c.processes[name] {
			l := r.logs.String()
			caught += strings.Count(l, "its local state is caught up from the changelog")
			dropped += strings.Count(l, "local state of the partition dropped")
		}
		t.Logf("router %s (%d processes): %d partitions caught up from a release mark, %d restored from the changelog's start after a drop",
			name, len(c.processes[name]), caught, dropped)
	}
	if !rep.OK() {
		for name, r := range c.routers {
			t.Logf("logs of router %s (last lines):\n%s", name, tailLines(r.logs.String(), 30))
		}
	}

	// the routers stop (a clean stop marks their partitions released);
	// then what the cleaner removed, and every store against the changelog
	for _, name := range slices.Sorted(maps.Keys(c.routers)) {
		if r := c.routers[name]; r.running() {
			r.stop(t)
		}
	}
	// and one more instance, alone, on an empty state directory: it
	// restores every partition from the compacted changelog's start, where
	// the tasks that expired and came back are a tombstone the cleaner
	// kept, then their new state; its store is compared too
	if !cfg.noSettle {
		restoreAll(t, c)
	}
	watch.caughtUp(ctx, t, 2*time.Minute)
	res.stateCleaned = cleanerReport(ctx, t, watch, stateTopic)
	res.breakersCleaned = cleanerReport(ctx, t, watch, breakersTopic)
	t.Logf("log cleaner: %s", res.stateCleaned)
	t.Logf("log cleaner: %s", res.breakersCleaned)
	res.storeTasks = checkStores(ctx, t, e, c.dirs)
	return res
}

// idleSettle bounds how long after a process's start the idle burst's
// breakers (addIdleBreakers) are let go when that process adopted their
// shared state: the provider/model breakers' idle time in the checker's
// runs (2 x (cooldown + window) of openCooldown), plus the checker's
// default LetGoLate (20 s) and a check's slack.
var idleSettle = 2*time.Duration(openCooldown["breakers.provider_model.cooldown_ms"]+openCooldown["breakers.provider_model.window_ms"])*time.Millisecond +
	25*time.Second

// idleSettled checks, and after the quiet stretch waits until a breaker
// of the idle burst has been let go on the breakers topic
// (Report.IdleShared), or idleSettle after the last process's start,
// checking again every 5 s.
// The burst's breakers are let go an idle time after their last use; but
// a process that starts adopts the states live on the topic as a use, and
// the quiet stretch restarts its instance each round. A breaker let go
// late (its retries held on an instance the faults paused or moved) is
// adopted again at each restart, and breaker.shared_not_let_go excuses it
// until its idle time plus LetGoLate after the last start. Past that
// bound the check has it either let go or left live, a violation. A
// breaker closed by its probes while the faults restarted the instances is
// neither: when none was let go by then, a second burst (idleBurst), with
// no process start after it, leaves its breakers idle, and the checks wait
// for them as long.
func (c *cluster) idleSettled(ctx context.Context, w *workload, produced *atomic.Int64, check func() *checker.Report) *checker.Report {
	rep := check()
	var last time.Time
	for _, ss := range c.starts {
		for _, s := range ss {
			if s.After(last) {
				last = s
			}
		}
	}
	for rep.IdleShared == 0 && time.Now().Before(last.Add(idleSettle)) {
		c.t.Logf("no idle breaker let go on the breakers topic yet (the last start %s ago); checking again in 5 s", time.Since(last).Round(100*time.Millisecond))
		time.Sleep(5 * time.Second)
		rep = check()
	}
	if rep.IdleShared > 0 {
		return rep
	}
	// the faults kept the first burst's breakers in use until they closed
	// (a restart adopts a shared state, and its held retries probe it): a
	// second burst, now that no process starts any more, leaves its
	// breakers to be let go
	c.t.Logf("the idle burst's breakers on the breakers topic:\n%s", idleBreakerTrail(capturedBreakers(ctx, c.t, c.e)))
	pm, _, _ := idleNames(1)
	c.t.Logf("no idle breaker was let go after the faults; a second burst of timeouts of %s/%s", pm[0], pm[1])
	began, before := time.Now(), rep.IdleShared
	if err := produceItems(ctx, c.e.prefix, w.idleBurst(1), 3, began, produced); err != nil {
		c.t.Fatal(err)
	}
	for rep.IdleShared <= before && time.Now().Before(began.Add(idleSettle)) {
		time.Sleep(5 * time.Second)
		rep = check()
	}
	return rep
}

// idleBreakerTrail lists the records of the breakers topic that name a
// breaker of the idle burst (addIdleBreakers), in the topic's order: what
// a run whose breaker.shared_not_let_go checked nothing shows of them.
func idleBreakerTrail(recs []*kgo.Record) string {
	var b strings.Builder
	for _, r := range recs {
		k := string(r.Key)
		if !strings.Contains(k, wlIdleModel[0]+"/") && !strings.Contains(k, "legacy-v") && !strings.Contains(k, wlIdleAction) {
			continue
		}
		what := "tombstone"
		if r.Value != nil {
			what = string(r.Value)
			if st, err := event.DecodeBreakerState(r.Value); err == nil {
				what = fmt.Sprintf("%s latched=%t reset=%t by %s: %s", st.State, st.Latched, st.Reset, st.Instance, st.Reason)
			}
		}
		var hs []string
		for _, h := range r.Headers {
			hs = append(hs, fmt.Sprintf("%s=%q", h.Key, h.Value))
		}
		fmt.Fprintf(&b, "  p%d@%d %s %s %s [%s]\n", r.Partition, r.Offset, r.Timestamp.UTC().Format("15:04:05.000"), k, what, strings.Join(hs, " "))
	}
	if b.Len() == 0 {
		return "  none\n"
	}
	return b.String()
}

// returnRounds are the rounds of cluster.returns.
const returnRounds = 2

// returns is a quiet stretch once every output settled, the way a task
// that expired and came back meets a restore: in each of returnRounds
// rounds, one task per home partition succeeds with an SLA of 1 s; once its
// tombstone is on the changelog (its TTL passed and the sweep forgot it) a
// new attempt of it comes, under the default SLA, and nothing else is
// routed in between, so that the tombstone and the task's new state follow
// each other on the changelog. Then the instance, alone, stops and starts
// again on an empty state directory, restoring every partition from the
// changelog's start (a pod rescheduled without its volume), while the
// cleaner has not yet passed the pair (it removes the tombstone once the
// new state is in a segment it cleans); and the new attempt is redelivered
// once more: the restored state must know it, so that it is dropped as a
// duplicate, not routed again (the model checks the audit; the store check
// compares the stores with the changelog). The instance's earlier state
// directories are compared with the changelog too.
func (c *cluster) returns(ctx context.Context, w *workload, watch *topicWatch, stateTopic string, produced *atomic.Int64) {
	t := c.t
	var names []string
	for name, r := range c.routers {
		if r.running() {
			names = append(names, name)
		}
	}
	if len(names) != 1 {
		t.Fatalf("the quiet stretch wants one instance running, not %v", names)
	}
	name := names[0]
	produce := func(items []workItem) {
		if err := produceItems(ctx, c.e.prefix, items, 3, time.Now(), produced); err != nil {
			t.Fatal(err)
		}
	}
	routed := func(what string) {
		if !waitFor(time.Minute, func() bool { return consumedAll(ctx, c.e, c.e.prefix+"ai.tasks.ingress") }) {
			t.Fatalf("returns: the router did not route %s within 1 min; logs:\n%s", what, tailLines(c.routers[name].logs.String(), 40))
		}
	}
	for round := range returnRounds {
		r := w.returns(round, 3)
		began := time.Now()
		produce(r.first)
		routed("the first attempts")
		if !waitFor(time.Minute, func() bool {
			seen := map[string]bool{}
			for _, rec := range watch.tombstonesOf(stateTopic) {
				seen[string(rec.Key)] = true
			}
			for _, id := range r.ids {
				if !seen[id] {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("returns: tasks %v were not tombstoned on the changelog within 1 min of their TTL", r.ids)
		}
		expired := time.Since(began)
		produce(r.again)
		routed("the attempts after expiry")
		s := time.Now()
		c.routers[name].stop(t)
		c.rebalances = append(c.rebalances, s)
		c.dirs[fmt.Sprintf("%s-%d", name, round)] = c.dirs[name]
		c.dirs[name] = t.TempDir()
		rt := c.start(name)
		if !waitFor(2*time.Minute, func() bool { return strings.Contains(rt.logs.String(), "state restored") }) {
			t.Fatalf("returns: %s on an empty state directory did not restore the state; logs:\n%s", name, tailLines(rt.logs.String(), 40))
		}
		produce(r.redelivered)
		routed("the redeliveries")
		t.Logf("returns, round %d: tasks %v tombstoned %s after their first attempt, came back, %s restarted on an empty state directory (took %s), redelivered",
			round, r.ids, expired.Round(100*time.Millisecond), name, time.Since(s).Round(100*time.Millisecond))
	}
}

// restoreAll starts instance "restored" on an empty state directory once
// the others stopped, waits until it restored the state of every partition
// (its log says so), and stops it: checkStores then compares what the
// router's own restore built with the changelog. After partitions were
// added it starts with the flags the others started with, as an operator
// restarts every instance to adopt the new count.
func restoreAll(t *testing.T, c *cluster) {
	t.Helper()
	r := c.start("restored")
	if !waitFor(2*time.Minute, func() bool {
		l := r.logs.String()
		return strings.Contains(l, "state restored") || strings.Contains(l, "state is up to date")
	}) {
		t.Fatalf("the instance on an empty state directory did not restore the state; logs:\n%s", tailLines(r.logs.String(), 40))
	}
	r.stop(t)
}

// readLogs reads every input and output topic to its committed end, and
// withState the tombstones of the state changelog: those a read finds, and
// those the watch read as they were written (the cleaner removes a
// tombstone delete.retention.ms after it first passed it). End is when the
// last topic was read: the router may commit while the topics are read one
// after another, and a record read was decided before its read.
func readLogs(ctx context.Context, t *testing.T, e *env, withState bool, watch *topicWatch) checker.Logs {
	t.Helper()
	topic := func(short string) string { return e.prefix + "ai.tasks." + short }
	logs := checker.Logs{
		Ingress:    readTopic(ctx, t, topic("ingress"), true),
		Decisions:  readTopic(ctx, t, topic("review.decisions"), true),
		Audit:      readTopic(ctx, t, topic("audit"), true),
		Retry:      readTopic(ctx, t, topic("retry"), true),
		Review:     readTopic(ctx, t, topic("review"), true),
		DeadLetter: readTopic(ctx, t, topic("deadletter"), true),
		Alerts:     readTopic(ctx, t, topic("alerts"), true),
	}
	if withState { // the changelog's tombstones are all the checker reads of it
		state := e.prefix + "faultrouter.state"
		watch.caughtUp(ctx, t, 2*time.Minute)
		logs.State = withTombstones(readTopic(ctx, t, state, true), watch.tombstonesOf(state))
	}
	logs.Breakers = capturedBreakers(ctx, t, e)
	logs.End = time.Now()
	return logs
}

// maxInputBytes is the --max-record-bytes of a run with unwritable inputs:
// ingress's max.message.bytes.
const maxInputBytes = 1 << 20

// smallestOutputLimit is the smallest max.message.bytes of the topics the
// router writes, as the cluster has them (a topic without its own takes the
// broker's message.max.bytes).
func smallestOutputLimit(ctx context.Context, t *testing.T, e *env) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var topics []string
	for _, short := range []string{"retry", "review", "audit", "deadletter", "alerts"} {
		topics = append(topics, e.prefix+"ai.tasks."+short)
	}
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, append(topics, e.prefix+"faultrouter.state")...)
	if err != nil {
		t.Fatal(err)
	}
	least := 0
	for _, rc := range rcs {
		if rc.Err != nil {
			t.Fatalf("describe %s: %v", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.Atoi(*c.Value); err == nil && (least == 0 || n < least) {
				least = n
			}
		}
	}
	if least == 0 {
		t.Fatal("no max.message.bytes among the output topics' configs")
	}
	return least
}

// writeReport writes the report as JSON beside the test's temporary files
// (FAULTROUTER_CHECKER_REPORTS names another directory) and returns its path.
func writeReport(t *testing.T, seed uint64, rep *checker.Report) string {
	dir := os.Getenv("FAULTROUTER_CHECKER_REPORTS")
	if dir == "" {
		dir = os.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("faultrouter-checker-%d-%s.json", seed, time.Now().UTC().Format("20060102T150405")))
	b, err := json.MarshalIndent(struct {
		Seed uint64 `json:"seed"`
		*checker.Report
	}{seed, rep}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// printSummary prints one row per run.
func printSummary(out io.Writer, results []checkerResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "seed\tinputs\ttasks\taudit\tretry\treview\tdeadletter\talerts\ttransitions\theld→released\tsuperseded\ttook\tviolations\tfaults\t")
	for _, r := range results {
		rep := r.rep
		v := 0
		for _, n := range rep.ViolationsByCheck {
			v += n
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t\n", r.cfg.seed, rep.Inputs, rep.Tasks, rep.Audit,
			rep.Retries, rep.Reviews, rep.DeadLetters, rep.Alerts, rep.Transitions, rep.HeldReleased, rep.Superseded,
			r.took.Round(time.Second), v, strings.Join(r.faults, ","))
	}
	tw.Flush()
}

// cluster is the router instances of one checker run.
type cluster struct {
	t       *testing.T
	e       *env
	bin     string
	args    []string // extra flags of every instance (the policy first)
	dirs    map[string]string
	routers map[string]*router
	// processes are every process of each instance, in the order started
	processes map[string][]*router
	starts    map[string][]time.Time // when each process of an instance started
	stops     map[string][]time.Time // when an instance stopped with no start after (scale-down)
	bins      map[string][]string    // and the router binary it ran
	// rebalances are when the group may have begun to rebalance for
	// another reason: a pause's session timeout and its resume, a stop, the
	// broker's restart
	rebalances []time.Time
}

// binAt is the router binary the process of instance that ran at t ran.
func (c *cluster) binAt(instance string, t time.Time) string {
	bin := ""
	for i, s := range c.starts[instance] {
		if !s.After(t) {
			bin = c.bins[instance][i]
		}
	}
	return bin
}

func (c *cluster) start(name string) *router {
	c.t.Helper()
	return c.startBin(name, c.bin)
}

// startBin starts instance name with another build of the router.
func (c *cluster) startBin(name, bin string) *router {
	c.t.Helper()
	if c.dirs[name] == "" {
		c.dirs[name] = c.t.TempDir()
	}
	c.starts[name] = append(c.starts[name], time.Now())
	c.bins[name] = append(c.bins[name], bin)
	r := c.e.startRouterBin(bin, name, c.dirs[name], c.args...)
	c.routers[name] = r
	c.processes[name] = append(c.processes[name], r)
	return r
}

// inject runs the faults, one after another, while the workload streams:
// every fault at least once. It returns their names in order.
func (c *cluster) inject(began time.Time, produced *atomic.Int64) []string {
	t := c.t
	var done []string
	at := func(d time.Duration) {
		if w := time.Until(began.Add(d)); w > 0 {
			time.Sleep(w)
		}
	}
	log := func(name string, since time.Time, format string, args ...any) {
		done = append(done, name)
		t.Logf("fault %s at stream %s (%d records produced): %s (took %s)", name, since.Sub(began).Round(100*time.Millisecond),
			produced.Load(), fmt.Sprintf(format, args...), time.Since(since).Round(100*time.Millisecond))
	}

	at(3 * time.Second)
	s := time.Now()
	c.routers["a"].kill()
	c.start("a")
	log("kill", s, "SIGKILL a, restarted on its state directory")

	at(8 * time.Second)
	s = time.Now()
	c.start("b")
	c.start("c")
	log("scale-up", s, "1 -> 3 instances")

	// three instances route together until the pause: a latch one of them
	// sets must hold the retries of the other two (breaker.latch_everywhere)
	at(22 * time.Second)
	s = time.Now()
	sessionTimeout := 10 * time.Second // the router's default
	pause := sessionTimeout + 6*time.Second
	b := c.routers["b"]
	syscall.Kill(-b.cmd.Process.Pid, syscall.SIGSTOP)
	time.Sleep(pause)
	syscall.Kill(-b.cmd.Process.Pid, syscall.SIGCONT)
	c.rebalances = append(c.rebalances, s.Add(sessionTimeout), time.Now())
	log("pause", s, "SIGSTOP b for %s, then SIGCONT", pause)

	if os.Getenv("FAULTROUTER_KAFKA_DIR") != "" {
		if out, err := exec.Command("../integration/kafka.sh", "brokers").Output(); err != nil || strings.TrimSpace(string(out)) != brokers {
			t.Fatalf("kafka.sh would restart %q, but the tests run against %q (set FAULTROUTER_KAFKA_PORT)", strings.TrimSpace(string(out)), brokers)
		}
		at(40 * time.Second)
		s = time.Now()
		cmd := exec.Command("../integration/kafka.sh", "restart")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kafka.sh restart: %v", err)
		}
		c.rebalances = append(c.rebalances, s, time.Now())
		log("broker-restart", s, "kafka.sh restart")
	} else {
		t.Logf("fault broker-restart skipped: FAULTROUTER_KAFKA_DIR is unset (integration/test.sh sets it)")
	}

	at(44 * time.Second)
	s = time.Now()
	c.rebalances = append(c.rebalances, s)
	for _, n := range []string{"b", "c"} {
		c.routers[n].stop(t)
		c.stops[n] = append(c.stops[n], time.Now())
		delete(c.routers, n)
	}
	log("scale-down", s, "3 -> 1 instances (SIGTERM b and c)")

	// a clean stop marks the partitions released, so the restart trusts its
	// local state and reads the checkpoints (after a SIGKILL it would wipe
	// them unread)
	at(48 * time.Second)
	s = time.Now()
	c.routers["a"].stop(t)
	corruptCheckpoints(t, c.dirs["a"])
	c.start("a")
	// the restart either reads the corrupt checkpoints and restores from the
	// changelog's start, or (when its release marks do not match the
	// changelog's end) drops its local state of the partition unread first
	how := "read the corrupt checkpoints and restored from the changelog's start"
	logs := func() string { return c.routers["a"].logs.String() }
	// the lines are written by the router's log goroutine, shortly after ready
	waitFor(10*time.Second, func() bool {
		return strings.Contains(logs(), "checkpoint is corrupt") || strings.Contains(logs(), "local state of the partition dropped")
	})
	switch logs := logs(); {
	case strings.Contains(logs, "checkpoint is corrupt"):
	case strings.Contains(logs, "local state of the partition dropped"):
		how = "did not trust its local state (release marks) and restored from the changelog's start"
	default:
		t.Errorf("fault restore-failure: the restarted router neither read a corrupt checkpoint nor dropped its local state")
	}
	log("restore-failure", s, "SIGTERM a, corrupted the changelog checkpoints in its Pebble store, restarted: it %s", how)
	return done
}

// corruptCheckpoints overwrites the changelog checkpoint of every partition
// in a stopped router's Pebble store with a value of the wrong length, a
// real corruption the restore must survive (store: "c/" + partition as a
// big-endian uint32, an 8-byte offset).
func corruptCheckpoints(t *testing.T, dir string) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatalf("open the stopped router's store: %v", err)
	}
	for p := range 3 {
		k := encbinary.BigEndian.AppendUint32([]byte("c/"), uint32(p))
		if err := db.Set(k, []byte{0xde, 0xad, 0xbe}, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// consumedAll reports whether the router group has committed every offset
// of the given topics.
func consumedAll(ctx context.Context, e *env, topics ...string) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return false
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return false
	}
	committed, err := adm.FetchOffsets(ctx, e.prefix+"router")
	if err != nil {
		return false
	}
	ok := true
	ends.Each(func(o kadm.ListedOffset) {
		c, found := committed.Lookup(o.Topic, o.Partition)
		// the router's own transactional writes (records it forwarded to
		// their task's partition) end in a marker no consumer commits past
		if o.Offset > 0 && (!found || c.At < o.Offset && !onlyMarkers(ctx, o.Topic, o.Partition, c.At, o.Offset)) {
			ok = false
		}
	})
	return ok
}

// onlyMarkers reports whether the offsets [from, end) of a partition hold
// transaction markers only (or aborted records): nothing left to consume.
func onlyMarkers(ctx context.Context, topic string, partition int32, from, end int64) bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return false
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(pctx)
		if pctx.Err() != nil {
			return false
		}
		data, last := false, int64(-1)
		fs.EachRecord(func(r *kgo.Record) {
			last = max(last, r.Offset)
			if !r.Attrs.IsControl() {
				data = true
			}
		})
		if data {
			return false
		}
		if last >= end-1 {
			return true
		}
	}
}

// quietPebble keeps Pebble's recovery messages out of the test log.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)      {}
func (quietPebble) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, "pebble: "+f+"\n", a...) }
func (quietPebble) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
