package router_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/lockedbuf"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// expWorld is a kfake cluster with the topics, a router on a fake clock and a
// collector of the audit and state topics.
type expWorld struct {
	t      *testing.T
	topics router.Topics
	seeds  []kgo.Opt
	codec  *codec.Codec
	clock  atomic.Int64 // the router clock, Unix ms
	prod   *kgo.Client
	reg    *prometheus.Registry // the router's metrics

	mu        sync.Mutex
	audit     []event.Routed
	auditKeys []string // the key (task ID) of each audit record
	retries   []event.Routed
	dead      []event.Routed // the dead-letter topic's routed records
	states    []*kgo.Record
	alerts    []event.BreakerEvent

	logs lockedLog // the router's log, in text form
}

// lockedLog is a log a router writes and a test reads.
type lockedLog struct{ lockedbuf.Buffer }

// lines returns the lines logged so far that contain every one of subs.
func (l *lockedLog) lines(subs ...string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			out = append(out, line)
		}
	}
	return out
}

func expStart(t *testing.T, clockMs int64) *expWorld {
	t.Helper()
	return expStartPolicy(t, clockMs, policy.Default())
}

// expStartPolicy is expStart with the router on policy p.
func expStartPolicy(t *testing.T, clockMs int64, p *policy.Policy) *expWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	w := &expWorld{t: t, seeds: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}}
	w.clock.Store(clockMs)
	if w.codec, err = codec.New(); err != nil {
		t.Fatal(err)
	}
	set, err := topicspec.Load("")
	if err != nil {
		t.Fatal(err)
	}
	set = set.WithPartitions(1)
	adm, err := kgo.NewClient(w.seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := set.Apply(ctx, kadm.NewClient(adm)); err != nil {
		t.Fatal(err)
	}
	name := func(short topicspec.Short) string {
		n, err := set.Name(short)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	w.topics = router.Topics{
		Ingress: name("ingress"), Decisions: name("decisions"), Retry: name("retry"), Review: name("review"),
		Audit: name("audit"), DeadLetter: name("deadletter"), Alerts: name("alerts"), State: name("state"),
		Breakers: name("breakers"),
	}

	cfg := router.Default()
	cfg.Policy = p
	cfg.ClientOpts = w.seeds
	cfg.Topics = w.topics
	cfg.StateDir = t.TempDir()
	cfg.Tick = 50 * time.Millisecond
	var logOut io.Writer = &w.logs
	if os.Getenv("EXP_LOG") != "" {
		logOut = io.MultiWriter(&w.logs, os.Stderr)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logOut, nil))
	cfg.Now = func() time.Time { return time.UnixMilli(w.clock.Load()) }
	w.reg = prometheus.NewRegistry()
	cfg.Registerer = w.reg
	rt, err := router.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()

	if w.prod, err = kgo.NewClient(w.seeds...); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(append(w.seeds,
		kgo.ConsumeTopics(w.topics.Audit, w.topics.State, w.topics.Retry, w.topics.Alerts, w.topics.DeadLetter),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatal(err)
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fs.EachRecord(func(rec *kgo.Record) {
				w.mu.Lock()
				defer w.mu.Unlock()
				if rec.Topic == w.topics.State {
					w.states = append(w.states, rec)
					return
				}
				if rec.Topic == w.topics.Alerts {
					a, err := w.codec.DecodeBreakerEvent(rec.Value)
					if err != nil {
						t.Errorf("alert does not decode: %v", err)
						return
					}
					w.alerts = append(w.alerts, a)
					return
				}
				r, err := w.codec.DecodeRouted(rec.Value)
				if err != nil {
					t.Errorf("%s record does not decode: %v", rec.Topic, err)
					return
				}
				if rec.Topic == w.topics.Retry {
					w.retries = append(w.retries, r)
					return
				}
				if rec.Topic == w.topics.DeadLetter {
					w.dead = append(w.dead, r)
					return
				}
				w.audit = append(w.audit, r)
				w.auditKeys = append(w.auditKeys, string(rec.Key))
			})
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		<-collected
		cons.Close()
		w.prod.Close()
		cluster.Close()
	})
	if !expWaitFor(30*time.Second, rt.Ready) {
		t.Fatal("router not ready within 30 s")
	}
	return w
}

// metric is the value of the router's metric name (a gauge or counter
// without labels).
func (w *expWorld) metric(name string) float64 {
	w.t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	w.t.Fatalf("no metric %s", name)
	return 0
}

func (w *expWorld) produce(evs ...event.TaskEvent) {
	w.t.Helper()
	for i := range evs {
		v, err := w.codec.EncodeTaskEvent(nil, &evs[i])
		if err != nil {
			w.t.Fatal(err)
		}
		rec := &kgo.Record{Topic: w.topics.Ingress, Key: []byte(evs[i].TaskID), Value: v}
		if err := w.prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			w.t.Fatal(err)
		}
	}
}

// auditOf returns the audit decisions of one task, in order.
func (w *expWorld) auditOf(taskID string) []event.Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ds []event.Decision
	for i, r := range w.audit {
		if w.auditKeys[i] == taskID {
			ds = append(ds, r.Decision)
		}
	}
	return ds
}

// waitAudit waits until the task has n audit records and returns them.
func (w *expWorld) waitAudit(taskID string, n int) []event.Decision {
	w.t.Helper()
	if !expWaitFor(30*time.Second, func() bool { return len(w.auditOf(taskID)) >= n }) {
		w.t.Fatalf("task %s: %d audit records, want %d: %+v", taskID, len(w.auditOf(taskID)), n, w.auditOf(taskID))
	}
	return w.auditOf(taskID)
}

// tombstones counts the changelog tombstones of one task.
func (w *expWorld) tombstones(taskID string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.states {
		if string(r.Key) == taskID && r.Value == nil {
			n++
		}
	}
	return n
}

// lastState decodes the task's latest changelog record (nil for none or a tombstone).
func (w *expWorld) lastState(taskID string) *task.State {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var st *task.State
	for _, r := range w.states {
		if string(r.Key) != taskID {
			continue
		}
		st = nil
		if r.Value != nil {
			var err error
			if st, err = w.codec.DecodeState(r.Value); err != nil {
				w.t.Fatalf("changelog record of %s: %v", taskID, err)
			}
		}
	}
	return st
}

func expWaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// expRefusal is a model refusal (terminal, to review) with a one-minute SLA:
// its state lives two minutes on the router clock.
func expRefusal(eventID, taskID string) event.TaskEvent {
	conf, valid, sla := 0.9, true, int64(60_000)
	return event.TaskEvent{
		EventID: eventID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "exp-test", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "I cannot help with that request.", SchemaValid: &valid, Confidence: &conf},
		Usage:  event.Usage{CostUSD: 0.01, Tokens: 100, ElapsedMs: 500},
		SLAMs:  &sla,
	}
}

// expSucceeded is a successful attempt (complete, audit only) with the same
// one-minute SLA.
func expSucceeded(eventID, taskID string) event.TaskEvent {
	ev := expRefusal(eventID, taskID)
	ev.Output.Text = "Your ticket is answered."
	return ev
}

// expUnknownWrite is a refund whose WRITE operation has an unknown outcome,
// with the same one-minute SLA.
func expUnknownWrite(eventID, taskID string) event.TaskEvent {
	ev := expRefusal(eventID, taskID)
	ev.Action, ev.Stage, ev.Status, ev.Output = "refund", event.StageBusiness, event.StatusError, nil
	ev.Error = &event.Error{Type: "TimeoutError", Message: "no receipt"}
	ev.Operation = &event.Operation{OpID: "op-" + taskID, Kind: event.OpWrite, ParamsSHA256: "ab12", State: event.OpUnknown}
	return ev
}

// Guards the TTL contract (docs/design.md): a task's state
// expires 2 x SLA after its last event on the router clock; the sweep over
// the expiry buckets writes a changelog tombstone for it; an event arriving
// after expiry starts a fresh task history (even an exact redelivery is
// routed again, with totals from zero); and a task with an unresolved WRITE
// operation (UNKNOWN) never expires, so its redelivery is still dropped.
// The task that expires is a completed one: a task with an open review item
// does not expire (TestOpenReviewItemOutlivesTheTaskTTL).
func TestExpiryForgetsStateButNotUnknownWrites(t *testing.T) {
	hourStart := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, hourStart+60_000)

	w.produce(expSucceeded("r-1", "exp-done"), expUnknownWrite("w-1", "exp-write"))
	if d := w.waitAudit("exp-done", 1)[0]; d.Class != event.ClassSucceeded || d.Route != event.RouteComplete {
		t.Fatalf("first event: %s/%s, want SUCCEEDED/COMPLETE", d.Class, d.Route)
	}
	if d := w.waitAudit("exp-write", 1)[0]; d.Class != event.ClassOutcomeUnknown {
		t.Fatalf("unknown write: %s/%s, want OUTCOME_UNKNOWN", d.Class, d.Route)
	}

	// the changelog carries the expiry, so that a restore rebuilds the index
	expWaitFor(30*time.Second, func() bool { return w.lastState("exp-done") != nil && w.lastState("exp-write") != nil })
	if got := w.lastState("exp-done"); got == nil || got.ExpiresAt != hourStart+60_000+2*60_000 {
		t.Errorf("changelog state of exp-done: %+v, want ExpiresAt = now + 2 x SLA = %d", got, hourStart+60_000+2*60_000)
	}
	if got := w.lastState("exp-write"); got == nil || got.ExpiresAt != 0 {
		t.Errorf("changelog state of exp-write: %+v, want ExpiresAt 0 (never, a WRITE is UNKNOWN)", got)
	}

	// within 2 x SLA the state holds: a redelivery is dropped
	w.clock.Add(100_000)
	w.produce(expSucceeded("r-1", "exp-done"))
	if d := w.waitAudit("exp-done", 2)[1]; d.Route != event.RouteDrop {
		t.Fatalf("redelivery within 2 x SLA: route %s, want DROP", d.Route)
	}

	// two hours on: the expiry bucket is over, the sweep forgets the task
	w.clock.Add(2 * time.Hour.Milliseconds())
	if !expWaitFor(30*time.Second, func() bool { return w.tombstones("exp-done") == 1 }) {
		t.Fatalf("no changelog tombstone for the expired task (got %d)", w.tombstones("exp-done"))
	}

	// an event after expiry starts fresh; the unknown write is still held
	w.produce(expSucceeded("r-1", "exp-done"), expUnknownWrite("w-1", "exp-write"))
	d := w.waitAudit("exp-done", 3)[2]
	if d.Class != event.ClassSucceeded || d.Route != event.RouteComplete || d.Totals.Attempts != 1 {
		t.Errorf("event after expiry: %s/%s attempts %d, want a fresh SUCCEEDED/COMPLETE with attempts 1 (reason %q)",
			d.Class, d.Route, d.Totals.Attempts, d.Reason)
	}
	if d := w.waitAudit("exp-write", 2)[1]; d.Route != event.RouteDrop {
		t.Errorf("redelivery of the unknown write two hours on: %s/%s, want DROP (state kept)", d.Class, d.Route)
	}
	if n := w.tombstones("exp-write"); n != 0 {
		t.Errorf("the task with an UNKNOWN WRITE operation got %d tombstones, want none", n)
	}
}

// Guards that expiry does not wait for the sweep: an event arriving after
// its task's ExpiresAt, while the expiry's hour bucket is still open (so the
// index does not list it yet), already starts a fresh task history.
func TestExpiryAppliesBeforeTheSweep(t *testing.T) {
	hourStart := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, hourStart+60_000)

	w.produce(expSucceeded("r-1", "exp-early"))
	w.waitAudit("exp-early", 1)

	w.clock.Add(10 * time.Minute.Milliseconds()) // past 2 x SLA, same hour bucket
	w.produce(expSucceeded("r-2", "exp-early"))
	d := w.waitAudit("exp-early", 2)[1]
	if d.Class != event.ClassSucceeded || d.Route != event.RouteComplete || d.Totals.Attempts != 1 {
		t.Errorf("event after expiry, before the sweep: %s/%s attempts %d, want a fresh SUCCEEDED/COMPLETE with attempts 1 (not DUPLICATE_EXECUTION)",
			d.Class, d.Route, d.Totals.Attempts)
	}
	if n := w.tombstones("exp-early"); n != 0 {
		t.Errorf("%d tombstones for a task that got a new event, want none", n)
	}
}

// retriesOf returns the retry-topic records of one task, in order.
func (w *expWorld) retriesOf(taskID string) []event.Routed { return w.ofTask(&w.retries, taskID) }

// deadOf returns the dead-letter records of one task, in order.
func (w *expWorld) deadOf(taskID string) []event.Routed { return w.ofTask(&w.dead, taskID) }

// ofTask returns the records of *recs whose event is of task taskID.
func (w *expWorld) ofTask(recs *[]event.Routed, taskID string) []event.Routed {
	w.mu.Lock()
	defer w.mu.Unlock()
	var rs []event.Routed
	for _, r := range *recs {
		if r.Event != nil && r.Event.TaskID == taskID {
			rs = append(rs, r)
		}
	}
	return rs
}

// Guards the TTL contract for a pending retry: a task waiting for its retry
// does not expire, however short its SLA. A 429 asks for a wait of 59 min
// while the task's sla_ms is 60 s (state TTL 2 min); an hour bucket later
// the expiry sweep runs (another task's event is routed then) and the retry
// is still not due: the task's state must survive it, and the retry is
// published once due.
func TestExpiryKeepsTaskWithPendingRetry(t *testing.T) {
	hourStart := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, hourStart+30*60_000) // 10:30

	ra := int64(59 * 60_000) // due 11:29
	ev := expRefusal("rl-1", "exp-429")
	ev.Stage, ev.Status, ev.Output = event.StageModel, event.StatusError, nil
	ev.Error = &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &ra}
	w.produce(ev)
	if d := w.waitAudit("exp-429", 1)[0]; d.Class != event.ClassRateLimited || d.Route != event.RouteRetry {
		t.Fatalf("429: %s/%s, want RATE_LIMITED/RETRY", d.Class, d.Route)
	}

	// 11:05: the 10:00 bucket is over (the state's plain TTL, 10:32, lies in
	// it); a batch routes another task, so the sweep has run at 11:05
	w.clock.Store(hourStart + 65*60_000)
	w.produce(expRefusal("o-1", "exp-other"))
	w.waitAudit("exp-other", 1)
	if n := w.tombstones("exp-429"); n != 0 {
		t.Fatalf("the task with a pending retry due at 11:29 got %d tombstones at 11:05", n)
	}

	// 11:30: the retry is due and published
	w.clock.Store(hourStart + 90*60_000)
	if !expWaitFor(30*time.Second, func() bool { return len(w.retriesOf("exp-429")) == 1 }) {
		t.Fatalf("the due retry of exp-429 was not published (tombstones %d)", w.tombstones("exp-429"))
	}
	if r := w.retriesOf("exp-429")[0]; r.Decision.Rule != "retry.due" || r.Decision.Retry == nil || r.Decision.Retry.DelayMs != ra {
		t.Errorf("retry record: rule %q retry %+v, want retry.due with delay %d", r.Decision.Rule, r.Decision.Retry, ra)
	}
	if n := w.tombstones("exp-429"); n != 0 {
		t.Errorf("exp-429 got %d tombstones, want none", n)
	}
}

// Guards the life of an open review item: it lives until a person decides
// it, however long after the task's own TTL. A refusal goes to review by
// ai_product (response SLA 72 h) while the task's sla_ms is 60 s (TTL
// 2 min). 73 h on, the sweep has run (another task is routed): the task is
// not forgotten and the item's overdue alert fires; the reviewer's approval,
// three days late, is applied (a retry with the same task ID), and after
// the decision the task expires on its own TTL again.
func TestOpenReviewItemOutlivesTheTaskTTL(t *testing.T) {
	hourStart := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, hourStart+60_000)

	w.produce(expRefusal("r-1", "exp-review"))
	if d := w.waitAudit("exp-review", 1)[0]; d.Route != event.RouteReview || d.Review == nil || d.Review.Owner != "ai_product" {
		t.Fatalf("refusal: %s/%s review %+v, want REVIEW by ai_product", d.Class, d.Route, d.Review)
	}
	expWaitFor(30*time.Second, func() bool { return w.lastState("exp-review") != nil })
	if st := w.lastState("exp-review"); st == nil || st.ExpiresAt != 0 {
		t.Errorf("changelog state with an open review item: %+v, want ExpiresAt 0 (never while open)", st)
	}

	// 73 h on: past the task's TTL and past the owner's SLA
	w.clock.Add(73 * time.Hour.Milliseconds())
	w.produce(expSucceeded("o-1", "exp-other")) // a batch on the late clock
	w.waitAudit("exp-other", 1)
	overdue := func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.alerts {
			if a.TaskID == "exp-review" && a.Kind == event.BreakerKindAlert {
				return true
			}
		}
		return false
	}
	if !expWaitFor(30*time.Second, overdue) {
		t.Errorf("no overdue alert for the review item open 73 h (owner SLA 72 h)")
	}
	if n := w.tombstones("exp-review"); n != 0 {
		t.Fatalf("the task with an open review item got %d tombstones after its TTL", n)
	}

	// the late approval is applied, not dropped as review.no_open_item
	w.decide("exp-review", true)
	d := w.waitAudit("exp-review", 2)[1]
	if d.Rule != "MANUAL_OVERRIDE_SUCCESS" || d.Route != event.RouteRetry {
		t.Fatalf("approval 73 h after the refusal: %s/%s rule %s (%s), want RETRY by MANUAL_OVERRIDE_SUCCESS", d.Class, d.Route, d.Rule, d.Reason)
	}
	if !expWaitFor(30*time.Second, func() bool { return len(w.retriesOf("exp-review")) == 1 }) {
		t.Fatalf("the approved retry of exp-review was not published")
	}

	// decided, the task expires 2 x SLA after the decision
	w.clock.Add(2 * time.Hour.Milliseconds())
	w.produce(expSucceeded("o-2", "exp-other"))
	if !expWaitFor(30*time.Second, func() bool { return w.tombstones("exp-review") == 1 }) {
		t.Errorf("the decided task was not forgotten 2 h after its decision (tombstones %d)", w.tombstones("exp-review"))
	}
}

// decide produces a reviewer's decision for the task's open item.
func (w *expWorld) decide(taskID string, approve bool) {
	w.t.Helper()
	rd := event.ReviewDecision{TaskID: taskID, Approve: approve, Reason: "checked by hand", Reviewer: "alice",
		At: event.At(time.UnixMilli(w.clock.Load()))}
	v, err := w.codec.EncodeReviewDecision(nil, &rd)
	if err != nil {
		w.t.Fatal(err)
	}
	rec := &kgo.Record{Topic: w.topics.Decisions, Key: []byte(taskID), Value: v}
	if err := w.prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
}

// Guards the end of an unknown write: a reviewer's decision on an
// OUTCOME_UNKNOWN item reconciles the operation (a reject closes it,
// RECONCILED; an approve takes it as not executed, PLANNED, and retries), so
// the task is no longer held forever and expires 2 x SLA after the decision.
func TestReconciledUnknownWriteExpires(t *testing.T) {
	hourStart := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, hourStart+60_000)

	w.produce(expUnknownWrite("w-1", "exp-rejected"), expUnknownWrite("w-1", "exp-approved"))
	for _, id := range []string{"exp-rejected", "exp-approved"} {
		if d := w.waitAudit(id, 1)[0]; d.Class != event.ClassOutcomeUnknown || d.Route != event.RouteReview {
			t.Fatalf("%s: %s/%s, want OUTCOME_UNKNOWN/REVIEW", id, d.Class, d.Route)
		}
	}
	w.clock.Add(30 * time.Minute.Milliseconds())
	w.decide("exp-rejected", false)
	w.decide("exp-approved", true)
	if d := w.waitAudit("exp-rejected", 2)[1]; d.Rule != "MANUAL_REJECTED" || !strings.Contains(d.Reason, "op-exp-rejected closed by the reviewer, never run again (RECONCILED)") {
		t.Errorf("reject of the unknown write: rule %s reason %q, want MANUAL_REJECTED naming the operation RECONCILED", d.Rule, d.Reason)
	}
	if d := w.waitAudit("exp-approved", 2)[1]; d.Route != event.RouteRetry || !strings.Contains(d.Reason, "op-exp-approved taken as not executed (PLANNED)") {
		t.Errorf("approve of the unknown write: %s reason %q, want RETRY naming the operation PLANNED", d.Route, d.Reason)
	}
	if !expWaitFor(30*time.Second, func() bool { return len(w.retriesOf("exp-approved")) == 1 }) {
		t.Fatalf("the approved retry of exp-approved was not published")
	}
	for _, id := range []string{"exp-rejected", "exp-approved"} {
		if !expWaitFor(30*time.Second, func() bool { st := w.lastState(id); return st != nil && st.ExpiresAt != 0 }) {
			t.Errorf("%s: changelog state %+v after reconciliation, want an ExpiresAt", id, w.lastState(id))
		}
	}

	w.clock.Add(2 * time.Hour.Milliseconds())
	w.produce(expSucceeded("o-1", "exp-other"))
	for _, id := range []string{"exp-rejected", "exp-approved"} {
		if !expWaitFor(30*time.Second, func() bool { return w.tombstones(id) == 1 }) {
			t.Errorf("%s: not forgotten 2 h after its reconciliation (tombstones %d)", id, w.tombstones(id))
		}
	}
}
