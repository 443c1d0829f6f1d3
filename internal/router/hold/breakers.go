// Package hold is the router's breaker holding, one part of its data path:
// the circuit breakers (pkg/breaker) and surge detectors, the due retries
// they hold, the latches of prompt templates, the breakers topic the
// router's instances share them through, and the records of the alerts
// topic. The router enters it through Breakers' methods, in a batch's
// order: Begin, AdoptShared, Observe/Reviewed/Command for each decided
// input, HoldAhead, Publishing, ReleaseHeld, HoldRetry and GiveUp for due
// retries, then Commit or Rollback with the batch's transaction. Its records
// go out through an Out (the batch's output); it reads task states from a
// StateLoader and the partitions this instance owns from an Owner.
package hold

// breakers.go connects the circuit breakers (pkg/breaker) to the data path:
// Observe feeds every decided task event into the breakers of its
// provider/model, downstream and prompt template and queues immediate
// alerts and surge alerts; holdRetry keeps a due retry pending while a
// breaker it would be published into is open. Every transition and alert
// becomes a BreakerEvent record on the alerts topic, in the batch's
// transaction.
//
// Each instance counts the outcomes it sees in its own windows, and shares
// every change of a breaker's state through the breakers topic
// (breakertable.go): a breaker that opens anywhere holds the retries
// everywhere, and a restarted instance starts with the breakers as the topic
// has them. A batch's
// breaker changes (outcomes counted, transitions, latches, half-open probes
// let through, surges) take effect only when its transaction commits: a
// batch that aborts is undone and, consumed again, makes them again, with its
// transitions and alerts. OPEN -> HALF_OPEN is evaluated when a
// breaker is next consulted (a held retry on the tick, or a new outcome),
// not on a timer of its own.
//
// A held retry stays pending in the task state and the due index, its due
// time moved to when its breakers are worth asking again (postpone), so it is
// not re-read and re-written on every tick. A retry that its breakers will
// still refuse when it comes due (one is OPEN past its due time) is held as
// soon as it is decided (holdAhead), so its state is written once. Retries held behind one breaker
// are released in their due order: up to half_open_probes of them when it
// half-opens, the rest once it has closed. Four things keep that order:
//   - the retries held behind a breaker are all moved to the same time (the
//     end of its cooldown, or its next recheck while half-open or latched:
//     breaker.Set.HoldUntil), and asked again together;
//   - the due index orders retries with the same time by their own due time
//     (task.PendingRetry.DueAt, kept in the state), not by task ID;
//   - a retry that comes due while retries held before it behind one of its
//     breakers that is not closed wait for their time is held with them
//     (heldUntil): it does not take a half-open breaker's probe from them;
//   - once every breaker of a held retry has closed (a success while
//     half-open, or a person's reset), the next sweep releases it
//     (releaseHeld), in due order with the others, whether or not the time
//     it was moved to has come (the sweep reads a bounded number of due
//     entries a batch, and would leave some for a later one): before any
//     retry that comes due after the close.
// While a breaker is latched (a hallucination's item of its prompt template,
// or a person's latch by hand), its retries are held until a person decides
// the item or resets the breaker, on every instance and across restarts:
// the latch is the breakers topic's, read in offset order
// (breakertable.go, internal/latch), not any instance's. A reviewer's
// decision ends its item; a RESET, written by `faultrouter breaker reset` or
// the console, ends the items written before it. Breaker commands on the
// decisions topic (RESET, LATCH) are the audit of those: every instance
// audits them, and none changes a breaker on reading one.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/latch"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Out is where the breakers queue their records: the batch's output,
// produced in the batch's transaction. A record is final once queued.
type Out interface {
	Queue(rec *kgo.Record)
}

// StateLoader reads task states from the state store (store.Store.Load):
// the state of each of ids into into, from the partition partOf names.
type StateLoader interface {
	Load(ids []string, partOf func(id string) int32, into map[string]*task.State) error
}

// Owner tells the partitions this instance owns (the router's assignment
// callbacks change them).
type Owner interface {
	// OwnedSet returns the ingress partitions this instance owns.
	OwnedSet() map[int32]bool
	// AssignedSince returns the partitions owned once the assignment is
	// restored (ready), with the count of rebalances it is of; ok is false
	// when no rebalance happened since the count since, or while one is
	// under way.
	AssignedSince(since uint64) (owned map[int32]bool, rebalances uint64, ok bool)
}

// Deps is what the breakers take from the router (Attach): its logger and
// codec, this instance's ID, the topics, the store of task states, the
// partitions it owns, and the ingress partition of a key.
type Deps struct {
	Log      *slog.Logger
	Codec    *codec.Codec
	Instance string
	Topics   topicspec.Topics
	Store    StateLoader
	Owner    Owner
	Home     func(key []byte) int32
}

// BreakerEvent kinds and the scope of a per-task alert.
const (
	breakerKindTransition = event.BreakerKindTransition
	breakerKindAlert      = event.BreakerKindAlert
	scopeTask             = breaker.ScopeTask
)

// Breakers is the router's breaker holding, one part of the data path. It
// owns the circuit breakers and surge detectors and what they decide: the
// outcomes of decided task events (observe), the due retries it holds while
// a breaker is open and releases in their due order (holdRetry, holdAhead,
// releaseHeld; the held set, heldset.go), the latches of breakers and the
// items that hold them, the breaker commands on the decisions topic it
// audits (command), the breakers topic it shares its changes through and
// adopts the other instances' and the latches from (breakertable.go),
// and the records of the alerts topic: transitions and alerts, also those
// other parts raise (alert). Its records go out through a Out, in the
// batch's transaction, and its changes are a unit with that transaction
// (begin, commit, rollback). It reads held retries' states from a
// stateLoader and the partitions this instance owns from an assignment. Used
// by the run loop's goroutine only.
type Breakers struct {
	set    *breaker.Set
	surges *breaker.Surges
	held   *heldSet // the retries held, by task ID and by breaker
	// closed are the breakers that have closed since the last sweep
	// (releaseHeld): only the retries held behind them can be released
	closed map[breaker.Ref]bool

	// heldUntil is, per breaker, the latest time retries held behind it
	// while it was open or half-open were moved to (Unix ms): while it is not
	// closed, a retry of that breaker coming due before then is held with
	// them.
	heldUntil breaker.RefMap[int64]
	// pruned is the count of rebalances (Router.rebalances) when the held
	// retries of partitions this instance no longer owns were last let go
	pruned uint64
	// closed, heldUntil and pruned as they were when the batch began (held
	// keeps its own undo log)
	savedPruned uint64
	savedClosed map[breaker.Ref]bool
	// adoptedReset is, per breaker, the offset of the last RESET whose
	// state this instance applied (AdoptShared): the states it derives
	// after it say so (codec.HeaderBreakerAfterReset)
	adoptedReset, savedAdoptedReset map[breaker.Ref]int64
	savedHeldUntil                  breaker.RefMap[int64]
	// refs is observe's scratch: the breakers of the event it observes;
	// holdRefs HoldRetry's and HoldAhead's (nothing keeps either slice: the
	// held set keeps its own copy of a held retry's breakers). keys builds
	// their provider/model keys.
	refs, holdRefs []breaker.Ref
	heldNames      map[heldName]string // holding's
	keys           policy.BreakerKeys
	itemKey        []byte // itemOpen's scratch

	// table reads the breakers topic and keeps the latches
	// (breakertable.go). adopting are the states it gave the batch
	// (adoptShared) and checked the breakers whose latch the batch checked:
	// given back if the batch does not commit
	table    *breakerTable
	adopting []pendingState
	checked  []breaker.Ref
	// batch are the latch items the batch opened or ended, shared how
	// many state records of each breaker it wrote, resetTombs the RESETs
	// it tombstoned:
	// the table counts them once it commits
	batch       map[string]batchItem
	shared      map[breaker.Ref]int
	resetTombs  map[breaker.Ref]bool
	itemScratch []latch.Item
	// expired is when idle breakers were last let go (expire)
	expired time.Time
	// catchingUpWait is the batches' wait for the breakers topic to be
	// read for the assignment, staleWait their wait for a fresh table
	// (Publishing)
	catchingUpWait, staleWait wait
	// fresh is the table's freshness when the batch adopted what it read
	// (adoptShared): its retries, and the release of a template, wait
	// unless it is recent (FreshFor)
	fresh time.Time

	// events are the transitions and alerts queued by the batch, logged
	// and counted once its transaction commits (commit)
	events []event.BreakerEvent

	// what it takes from the router (Router.attachBreakers)
	log      *slog.Logger
	codec    *codec.Codec
	framer   *registry.Framer // the alerts' wire format; nil: single-object
	instance string
	topics   topicspec.Topics
	store    StateLoader
	owner    Owner
	home     func(key []byte) int32 // the ingress partition of a key

	states           *prometheus.GaugeVec
	transitionsTotal *prometheus.CounterVec
	alertsTotal      *prometheus.CounterVec
	heldGauge        prometheus.Gauge
	heldExpired      prometheus.Counter
	catchingUp       prometheus.Gauge
	latchItemsGauge  prometheus.Gauge

	// heldExpiry is when a held retry is given up (policy.HeldRetryExpiry);
	// expiredHeld how many the batch gave up
	heldExpiry  func(st *task.State) int64
	expiredHeld int
}

// New returns the breakers of policy p, their metrics registered with reg
// (nil: not registered). Attach gives them the rest.
func New(p *policy.Policy, reg prometheus.Registerer) (*Breakers, error) {
	set, err := breaker.NewSet(p.Breakers.ProviderModel.Config(), p.Breakers.Downstream.Config(),
		p.Breakers.PromptTemplate.Config())
	if err != nil {
		return nil, fmt.Errorf("router: Policy.Breakers: %w", err)
	}
	set.SetLimits(p.BreakerLimitsFunc()) // the overrides' breaker limits, if any
	surges, err := newSurges(p.Surge)
	if err != nil {
		return nil, fmt.Errorf("router: Policy.Surge: %w", err)
	}
	const ns = "faultrouter"
	b := &Breakers{
		set:          set,
		surges:       surges,
		held:         newHeldSet(),
		heldNames:    map[heldName]string{},
		adoptedReset: map[breaker.Ref]int64{},
		closed:       map[breaker.Ref]bool{},
		states: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "breakers",
			Help: "Circuit breakers of this instance by scope and state."}, []string{"scope", "state"}),
		transitionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "breaker_transitions_total",
			Help: "Circuit breaker transitions, by scope and the state entered."}, []string{"scope", "to"}),
		alertsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "alerts_total",
			Help: "Alerts (hallucination, budget exhausted, surge) written to the alerts topic, by class."}, []string{"class"}),
		heldGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "retries_held",
			Help: "Due retries held because a breaker they would be published into is open."}),
		heldExpired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "retries_held_expired_total",
			Help: "Retries held behind breakers until their task's lifetime ended (2 x SLA after their due time), sent to the dead-letter topic instead of published."}),
		heldExpiry: p.HeldRetryExpiry,
		catchingUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "breakers_catching_up",
			Help: "1 while no retry is published because the breakers topic is not read to where it stood when the assignment began, or to a listing of its offsets taken in the last 2 s."}),
		latchItemsGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "breaker_latch_items",
			Help: "Latch items live on the breakers topic as this instance has read it (open, or ended by a RESET and not tombstoned yet)."}),
	}
	for _, sc := range breaker.Scopes {
		for _, st := range breaker.States {
			b.states.WithLabelValues(sc.String(), st.String()).Set(0)
		}
	}
	if reg != nil {
		reg.MustRegister(b.states, b.transitionsTotal, b.alertsTotal, b.heldGauge, b.heldExpired, b.catchingUp, b.latchItemsGauge)
	}
	return b, nil
}

// Attach gives k what it takes from the router. Without a breakers topic
// (Topics.Breakers empty) the breakers are this instance's own.
func (k *Breakers) Attach(d Deps) {
	k.log, k.codec, k.instance, k.topics = d.Log, d.Codec, d.Instance, d.Topics
	k.store, k.owner, k.home = d.Store, d.Owner, d.Home
	k.table = newBreakerTable(d.Topics.Breakers, d.Instance, d.Log)
}

// SetFramer makes f the wire format of the alerts (nil: single-object).
func (k *Breakers) SetFramer(f *registry.Framer) { k.framer = f }

// Current reports whether the breakers topic is read to where it stood
// when the latest assignment began (the router is not ready until it is).
func (k *Breakers) Current() bool { return k.table.current() }

func newSurges(p policy.Surge) (*breaker.Surges, error) {
	cfg, err := p.Config()
	if err != nil {
		return nil, err
	}
	return breaker.NewSurges(cfg)
}

// Observe feeds a decided task event into its breakers and queues the
// BreakerEvents of the transitions and immediate alerts it causes; a
// reviewer's decision may reset the template a hallucination latched
// (reviewed). The input's state is the one it was routed on (in.state).
func (k *Breakers) Observe(ev *event.TaskEvent, d *event.Decision, st *task.State, out Out, now time.Time) {
	if d.Route == event.RouteDrop {
		return
	}
	refs := k.keys.AppendRefs(k.refs[:0], ev)
	k.refs = refs
	for _, ref := range refs {
		if o, ok := policy.BreakerOutcome(ref, ev, d.Class); ok {
			k.transitions(k.set.Record(o, now), out, now)
		}
	}
	k.surge(ev, refs, d.Class, out, now)
	if ev.PromptTemplate != "" && !policy.HoldsLatchItem(st) {
		ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: ev.PromptTemplate}
		if k.itemOpen(ref, ev.TaskID) {
			k.shareItem(ref, ev.TaskID, false, out, now) // a re-drive cleared the task's item
			k.syncLatch(ref, out, now)
		}
	}
	switch d.Class {
	case event.ClassHallucination:
		key := ev.PromptTemplate
		if key == "" {
			key = "(none)"
		}
		k.Alert(out, now, codec.AlertQuarantined, event.BreakerEvent{Scope: breaker.PromptTemplate.Name(), Key: key, Kind: breakerKindAlert,
			Reason: "output quarantined: " + d.Reason, Class: d.Class, TaskID: ev.TaskID})
		if ref, ok := policy.LatchesTemplate(ev, d.Class); ok {
			// every hallucination writes its item, latched here or not: the
			// item, above the template's last RESET, is the latch
			k.shareItem(ref, ev.TaskID, true, out, now)
			if !k.set.Latched(ref) {
				k.transitionEvents(k.set.Trip(ref, "MODEL_HALLUCINATION: open until a person resets it",
					breaker.Outcome{Class: string(d.Class), TaskID: ev.TaskID}, now), out)
			}
		}
	case event.ClassBudgetExhausted:
		k.Alert(out, now, codec.AlertBudget, event.BreakerEvent{Scope: scopeTask, Key: ev.TaskID, Kind: breakerKindAlert,
			Reason: d.Reason, Class: d.Class, TaskID: ev.TaskID})
	}
}

// surge feeds a decided task event into the surge detector of its prompt
// template and provider/model (refs: policy.BreakerRefs of the event) and
// queues an ALERT for a surge it starts.
func (k *Breakers) surge(ev *event.TaskEvent, refs []breaker.Ref, class event.Class, out Out, now time.Time) {
	for _, ref := range refs {
		s, fired := k.surges.Record(ref, string(class), ev.TaskID, now)
		if fired {
			k.Alert(out, now, codec.AlertSurge, event.BreakerEvent{Scope: s.Scope.Name(), Key: s.Key, Kind: breakerKindAlert,
				Reason: s.Reason, Class: class, Failures: s.Count, Requests: s.Total, TaskID: ev.TaskID})
		}
	}
}

// Reviewed ends the latch item of a hallucination whose review item a
// person decided (approved or rejected): the template is released once no
// other item holds it (holdingItems: every instance's items above its last
// RESET). While others do, it stays latched (the console says so on each
// item). A decision for an item already ended changes nothing.
func (k *Breakers) Reviewed(rv *event.ReviewDecision, d *event.Decision, st *task.State, out Out, now time.Time) {
	if st == nil {
		return
	}
	ref, ok := policy.ReviewResetsTemplate(d, st.LastEvent)
	if !ok {
		return
	}
	k.shareItem(ref, rv.TaskID, false, out, now)
	if !k.set.Latched(ref) {
		return // reset since: nothing holds it any more
	}
	if others := k.holdingItems(ref); len(others) > 0 {
		k.log.Info("template stays latched: other hallucination items are open", "task_id", rv.TaskID,
			"prompt_template", ref.Key, "open_items", len(others))
		return
	}
	if !k.tableFresh() {
		// another instance's item may be missing from the table: the
		// template reopens once the table is fresh (syncLatch), if no item
		// holds it then
		k.log.Info("template stays latched until the breakers table is fresh", "task_id", rv.TaskID, "prompt_template", ref.Key)
		k.table.dirtyAgain([]breaker.Ref{ref})
		return
	}
	who := rv.Reviewer
	if who == "" {
		who = "a reviewer"
	}
	reason := fmt.Sprintf("%s decided the MODEL_HALLUCINATION item of task %s: %s", who, rv.TaskID, rv.Reason)
	ts, from := k.unlatch(ref, reason, now)
	for i := range ts {
		ts[i].TaskID, ts[i].Class = rv.TaskID, string(d.Class)
	}
	k.transitionEventsFrom(ts, out, from)
}

// Command audits a RESET or LATCH command from the decisions topic and
// returns its decision (policy.BreakerCommand): every instance gets it on
// each decisions partition it owns. The breakers topic's RESET record or
// latch item written with it, in the same transaction, is what changes the
// breaker, on every instance in the topic's order (adoptShared): a command
// applied late must not reset a latch made after it. Without a breakers
// topic this instance's breakers are its own, and the command is applied
// here.
func (k *Breakers) Command(c *event.BreakerEvent, out Out, now time.Time) event.Decision {
	ref, invalid := policy.BreakerCommand(c, now)
	if invalid != nil {
		return *invalid
	}
	if k.topics.Breakers != "" {
		return policy.BreakerCommandAudited(c, ref, now)
	}
	who := c.Instance
	if who == "" {
		who = "an operator"
	}
	changed := false
	switch c.Kind {
	case event.BreakerKindLatch:
		changed = !k.set.Latched(ref)
		task := c.TaskID
		if task == "" {
			task = event.BreakerLatchTask(who, c.At)
		}
		k.shareItem(ref, task, true, out, now)
		k.syncLatch(ref, out, now)
	default:
		k.table.localReset(ref, event.BreakerState{Scope: c.Scope, Key: c.Key, State: breaker.Closed.Name(), Reset: true,
			Reason: c.Reason, UpdatedAt: c.At, Instance: who})
		for key, it := range k.batch { // the batch's own items were written before it
			if it.ref == ref && it.open {
				delete(k.batch, key)
			}
		}
		latched := k.set.Latched(ref)
		k.syncLatch(ref, out, now)
		reason := fmt.Sprintf("%s reset the breaker: %s", who, c.Reason)
		ts := k.set.Reset(ref, reason, now)
		for i := range ts {
			ts[i].TaskID, ts[i].Class = c.TaskID, string(c.Class)
		}
		changed = latched || len(ts) > 0
		k.transitionEvents(ts, out)
	}
	return policy.BreakerCommandApplied(c, ref, changed, now)
}

// HoldRetry reports whether the due retry of ev must stay pending because a
// breaker it would be published into is open (or half-open with its probes
// out). A retry it lets through a half-open breaker is that breaker's probe.
// st is the state of ev's task, p its partition.
func (k *Breakers) HoldRetry(ev *event.TaskEvent, st *task.State, p int32, out Out, now time.Time) bool {
	if ev == nil {
		return false
	}
	refs := k.retryRefs(ev)
	// retries held before this one behind one of its breakers that is not
	// closed, not yet asked again: it waits with them (and does not take a
	// half-open breaker's probe from them)
	behind := k.heldBehind(refs, now)
	ok := behind == 0
	if ok {
		var ts []breaker.Transition
		ok, ts = k.set.Allow(refs, now)
		k.transitions(ts, out, now)
	}
	_, wasHeld := k.held.get(ev.TaskID)
	switch {
	case !ok && !wasHeld:
		k.held.put(ev.TaskID, p, refs)
		msg := "retry held: breaker open"
		if behind != 0 {
			msg = "retry held: behind retries held before it"
		}
		if k.log.Enabled(context.Background(), slog.LevelInfo) { // the breaker's name is built only for a line written
			// five attributes, as many as a record holds without an
			// allocation: the action is in the breaker's name when its
			// downstream breaker is the one
			k.taskLine(msg, slog.String("task_id", ev.TaskID), slog.String("provider", ev.Provider), slog.String("model", ev.Model),
				slog.String("prompt_template", ev.PromptTemplate), k.holding(refs))
		}
	case ok && wasHeld:
		k.held.del(ev.TaskID)
		k.taskLine("held retry released", slog.String("task_id", ev.TaskID), slog.String("provider", ev.Provider), slog.String("model", ev.Model))
	}
	if !ok {
		k.postpone(st, refs, behind, now)
	}
	k.heldGauge.Set(float64(k.held.len()))
	return !ok
}

// holding names the first of refs that is not closed, and its state, for
// a held retry's line: the breaker it waits for. Each name is built once
// (a breaker in one of its states) and kept: no allocation per line.
func (k *Breakers) holding(refs []breaker.Ref) slog.Attr {
	for _, ref := range refs {
		st := k.set.State(ref)
		if st == breaker.Closed {
			continue
		}
		h := heldName{ref: ref, state: st, latched: k.set.Latched(ref)}
		name, ok := k.heldNames[h]
		if !ok {
			name = ref.String() + " (" + string(st.Name())
			if h.latched {
				name += ", latched"
			}
			name += ")"
			if len(k.heldNames) >= maxHeldNames {
				clear(k.heldNames)
			}
			k.heldNames[h] = name
		}
		return slog.String("breaker", name)
	}
	return slog.String("breaker", "")
}

// heldName is a breaker in a state, as holding names it.
type heldName struct {
	ref     breaker.Ref
	state   breaker.State
	latched bool
}

// maxHeldNames bounds holding's names: past it they are built anew.
const maxHeldNames = 4096

// retryRefs are the breakers ev's retry would be published into, each
// resolved to the breaker that guards it (a key beyond breaker.MaxBreakers
// is held behind its overflow breaker), in holdRefs: valid until the next
// call.
func (k *Breakers) retryRefs(ev *event.TaskEvent) []breaker.Ref {
	k.holdRefs = k.keys.AppendRefs(k.holdRefs[:0], ev)
	return k.set.Resolve(k.holdRefs)
}

// taskLine logs a line at level Info about one retry: under an outage there
// is one for most retries that come due, so the record is built here with
// no caller looked up (slog.Logger.Info looks it up; no handler here
// prints it).
func (k *Breakers) taskLine(msg string, attrs ...slog.Attr) {
	if !k.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, msg, 0)
	rec.AddAttrs(attrs...)
	_ = k.log.Handler().Handle(context.Background(), rec) // as slog.Logger does, a handler's error is dropped
}

// HoldAhead holds, as soon as it is decided, a retry that its breakers will
// still refuse when it comes due: one of them is OPEN past its due time (an
// open breaker stays open until its cooldown ends, unless a person resets
// it), or retries held before it behind one of them that is not closed wait
// past its due time. Its due time is moved at once where holdRetry would move
// it then, computed at its due time (postpone), so that its state is written
// once, not read back by the sweep a second or so later only to be held and
// written again. Under an outage, when breakers are open, that was most of
// the router's work per event. If its breakers close before it comes due,
// ReleaseHeld moves it back to its own due time. st is the state of ev's
// task, p its partition. It reports whether it held the retry now (not held
// before): the caller's decision line says so, instead of a line of its own.
func (k *Breakers) HoldAhead(ev *event.TaskEvent, st *task.State, p int32, now time.Time) (heldNow bool) {
	if st == nil || st.Pending == nil || st.Pending.NotBefore <= now.UnixMilli() {
		return false
	}
	due := st.Pending.NotBefore
	at := time.UnixMilli(due)
	refs := k.retryRefs(ev)
	behind := k.heldBehind(refs, at)
	refused := behind != 0
	for _, ref := range refs {
		if !refused && k.set.State(ref) == breaker.Open && k.set.HoldUntil([]breaker.Ref{ref}, at).UnixMilli() > due {
			refused = true
		}
	}
	if !refused {
		return false // its breakers may let it through when it comes due: holdRetry decides then
	}
	if _, held := k.held.get(ev.TaskID); !held {
		k.held.put(ev.TaskID, p, refs)
		heldNow = true
	}
	k.postpone(st, refs, behind, at)
	k.heldGauge.Set(float64(k.held.len()))
	return heldNow
}

// postpone moves a held retry's due time to when its breakers are worth
// asking again (or, behind retries held before it, to theirs), so that a held
// retry is neither re-read and re-written on every tick nor in front of other
// due retries of its partition. The retry keeps its own due time (DueAt),
// which orders it among the retries moved to the same time. st is the held
// retry's task state.
func (k *Breakers) postpone(st *task.State, refs []breaker.Ref, behind int64, now time.Time) {
	for _, ref := range refs {
		if s := k.set.State(ref); s == breaker.Open || s == breaker.HalfOpen {
			own := k.set.HoldUntil([]breaker.Ref{ref}, now).UnixMilli()
			if u, _ := k.heldUntil.Get(ref); own > u {
				k.heldUntil.Set(ref, own)
			}
		}
	}
	if st == nil || st.Pending == nil {
		return
	}
	until := max(k.set.HoldUntil(refs, now).UnixMilli(), behind)
	if end := k.heldExpiry(st); end > now.UnixMilli() {
		until = min(until, end) // asked again when it is given up (giveUp)
	}
	if p := st.Pending; until > p.NotBefore {
		p.DueAt = p.Due()
		p.NotBefore = until
	}
}

// GiveUp ends the held retry of st's task when its task's lifetime has
// ended (policy.HeldRetryExpiry) and reports whether it did: its decision,
// to the dead-letter topic (rule retry.held_expired), naming the breakers
// that still hold it. The caller writes the record and clears the retry.
func (k *Breakers) GiveUp(st *task.State, now time.Time) (event.Decision, bool) {
	if st.Pending == nil || now.UnixMilli() < k.heldExpiry(st) {
		return event.Decision{}, false
	}
	var holding []string
	if h, ok := k.held.get(st.TaskID); ok {
		for i := range h.n {
			ref := k.held.refs[h.refs[i]]
			if s := k.set.State(ref); s != breaker.Closed {
				holding = append(holding, fmt.Sprintf("%s (%s)", ref, s))
			}
		}
	}
	if len(holding) == 0 {
		holding = []string{"retries held before it"}
	}
	k.held.del(st.TaskID)
	k.expiredHeld++ // counted once the batch commits
	k.heldGauge.Set(float64(k.held.len()))
	return policy.RetryHeldExpired(st, strings.Join(holding, ", "), now), true
}

// Forget lets go of the held retry of task id, if any: a decision replaced
// it.
func (k *Breakers) Forget(id string) {
	if _, ok := k.held.get(id); ok {
		k.held.del(id)
		k.heldGauge.Set(float64(k.held.len()))
	}
}

// heldBehind is the latest time retries held behind one of refs that is not
// closed were moved to, when it is still to come, else 0. (The retries held
// behind a breaker that has closed are released at once: releaseHeld.)
func (k *Breakers) heldBehind(refs []breaker.Ref, now time.Time) int64 {
	var until int64
	for _, ref := range refs {
		if u, _ := k.heldUntil.Get(ref); u > now.UnixMilli() && k.set.State(ref) != breaker.Closed {
			until = max(until, u)
		}
	}
	return until
}

// ReleaseHeld makes the retries held behind breakers that have all closed
// since due now, in the order of their own due times, so that this batch
// publishes them (publishDue) before any retry due after them, rather than
// leaving them to wait for the time their breakers were to be asked again.
// A retry whose task has moved on (its held retry superseded or published,
// its partition no longer this instance's) is forgotten.
//
// Its cost is that of the retries it may release: it looks only at the
// retries held behind a breaker that has closed since the last sweep (a
// retry is held while one of its breakers is not closed, so the last of them
// to close is among those), and reads their states in one sorted pass: the
// batch's (states) where it has them, else the store's. It hands each retry
// it releases to load, which makes its state the batch's, before it moves
// its due time.
func (k *Breakers) ReleaseHeld(states map[string]*task.State, load func(st *task.State, p int32), now time.Time) error {
	if len(k.closed) == 0 {
		return nil
	}
	ids := k.held.behind(k.closed)
	clear(k.closed)
	if len(ids) == 0 {
		return nil
	}
	nowMs := now.UnixMilli()
	owned := k.owner.OwnedSet()
	type release struct {
		id string
		p  int32
		st *task.State
	}
	var (
		cand   []release // held behind breakers that have all closed, on owned partitions
		toLoad []string
	)
	for _, id := range ids {
		h, _ := k.held.get(id)
		if k.held.anyNot(h, func(ref breaker.Ref) bool { return k.set.State(ref) == breaker.Closed }) {
			continue
		}
		if !owned[h.partition] {
			k.held.del(id)
			continue
		}
		cand = append(cand, release{id: id, p: h.partition})
		if _, ok := states[id]; !ok {
			toLoad = append(toLoad, id)
		}
	}
	stored := make(map[string]*task.State, len(toLoad))
	partOf := func(id string) int32 {
		h, _ := k.held.get(id)
		return h.partition
	}
	if err := k.store.Load(toLoad, partOf, stored); err != nil {
		return err
	}
	// every candidate still held is released, including one whose breakers'
	// time has come (its due entry is at or before now): left to the sweep,
	// which reads a bounded number of due entries a batch, it could come out
	// after the retries released here that were due after it
	rel := cand[:0]
	for _, c := range cand {
		st, ok := states[c.id]
		if !ok {
			st = stored[c.id]
		}
		// a retry moved by a breaker keeps its own due time: any other
		// pending retry is a new one
		if st == nil || st.Pending == nil || st.Pending.DueAt == 0 {
			k.held.del(c.id)
			continue
		}
		c.st = st
		rel = append(rel, c)
	}
	slices.SortFunc(rel, func(x, y release) int {
		return cmp.Or(cmp.Compare(x.st.Pending.Due(), y.st.Pending.Due()), cmp.Compare(x.st.TaskID, y.st.TaskID))
	})
	for _, x := range rel {
		load(x.st, x.p)
		if x.st.Pending.NotBefore > nowMs {
			// a retry held ahead of its due time (holdAhead) waits for it
			x.st.Pending.NotBefore = max(nowMs, x.st.Pending.DueAt)
		}
	}
	k.heldGauge.Set(float64(k.held.len()))
	return nil
}

// transitions queues one BreakerEvent per transition of this instance's own
// making, and shares the state each leaves on the breakers topic.
func (k *Breakers) transitions(ts []breaker.Transition, out Out, now time.Time) {
	k.transitionEvents(ts, out)
	for _, t := range ts {
		k.share(t.Ref, t.Reason, out, now)
	}
}

// transitionEvents queues one BreakerEvent per transition.
func (k *Breakers) transitionEvents(ts []breaker.Transition, out Out) {
	k.transitionEventsFrom(ts, out, "")
}

// transitionEventsFrom queues one BreakerEvent per transition; adoptedFrom,
// when not empty, is the instance whose change on the breakers topic they
// were adopted from (a faultrouter.breaker.adopted_from header).
func (k *Breakers) transitionEventsFrom(ts []breaker.Transition, out Out, adoptedFrom string) {
	for _, t := range ts {
		if t.To == breaker.Closed {
			k.closed[t.Ref] = true
		}
		rec := k.eventRecord(&event.BreakerEvent{Scope: t.Scope.Name(), Key: t.Key, Kind: breakerKindTransition,
			From: t.From.Name(), To: t.To.Name(), Reason: t.Reason, Class: event.Class(t.Class),
			Failures: t.Failures, Requests: t.Requests, TaskID: t.TaskID, Instance: k.instance, At: event.At(t.At)})
		if rec == nil {
			continue
		}
		if adoptedFrom != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderBreakerAdoptedFrom, Value: []byte(adoptedFrom)})
		}
		latched := "false"
		if t.To == breaker.Open && k.set.Latched(t.Ref) {
			latched = "true"
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte(latched)})
		out.Queue(rec)
	}
}

// Alert queues an immediate alert; kind is what it is about (a
// codec.Alert* value, its faultrouter.alert header).
func (k *Breakers) Alert(out Out, now time.Time, kind string, e event.BreakerEvent) {
	e.Instance, e.At = k.instance, event.At(now)
	if rec := k.eventRecord(&e); rec != nil {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(kind)})
		out.Queue(rec)
	}
}

// eventRecord is the alerts topic's record of e, which is logged and counted
// if the batch commits (events); nil if it does not encode.
func (k *Breakers) eventRecord(e *event.BreakerEvent) *kgo.Record {
	v, err := k.codec.EncodeBreakerEvent(nil, e)
	if err != nil { // only a bug can get here: every field is the router's own
		k.log.Error("breaker event does not encode", "task_id", e.TaskID, "err", err)
		return nil
	}
	k.events = append(k.events, *e)
	return &kgo.Record{Topic: k.topics.Alerts, Key: []byte(string(e.Scope) + "/" + e.Key), Value: k.framer.Frame(k.topics.Alerts, v)}
}

// Begin starts the batch's unit of breaker changes: they take effect only
// when the batch's transaction commits (commit); a batch that aborts or
// fails is consumed again, so its changes are undone (rollback) and made
// again, and so are its transitions and alerts. now is the batch's time.
func (k *Breakers) Begin(now time.Time) {
	k.events = k.events[:0]
	k.expiredHeld = 0
	k.set.Begin()
	k.surges.Begin()
	k.held.begin()
	clear(k.batch)
	clear(k.shared)
	clear(k.resetTombs)
	k.adopting, k.checked = k.adopting[:0], k.checked[:0]
	k.savedClosed = maps.Clone(k.closed)
	k.savedAdoptedReset = maps.Clone(k.adoptedReset)
	// a time that has passed holds no more retries: forget it
	nowMs := now.UnixMilli()
	for ref, until := range k.heldUntil.All {
		if until < nowMs {
			k.heldUntil.Delete(ref)
		}
	}
	k.savedHeldUntil = k.heldUntil.Clone()
	k.savedPruned = k.pruned
	k.pruneHeld()
}

// pruneHeld lets go of the retries held for partitions that moved away,
// once after each rebalance, when the assignment is restored
// (assignment.assignedSince). A rebalance may revoke every partition
// before it assigns them again (an eager one always does), and the owned
// set is empty in between:
// pruned then, the retries held for the partitions that stay would come out
// at the times they were moved to rather than in their due order when their
// breaker closes.
func (k *Breakers) pruneHeld() {
	owned, rb, ok := k.owner.AssignedSince(k.pruned)
	if !ok {
		return
	}
	k.held.keepPartitions(owned)
	k.pruned = rb
}

// Commit keeps the batch's breaker changes once its transaction has
// committed, and logs and counts its transitions and alerts: only committed
// ones.
func (k *Breakers) Commit() {
	k.table.wrote(k.batch, k.shared, k.resetTombs)
	clear(k.batch)
	k.set.Commit()
	k.surges.Commit()
	k.held.commit()
	k.heldExpired.Add(float64(k.expiredHeld))
	k.expiredHeld = 0
	for i := range k.events {
		e := &k.events[i]
		attrs := []any{"scope", e.Scope, "key", e.Key, "reason", e.Reason}
		if e.TaskID != "" { // a cooldown or a reset has no triggering task
			attrs = append([]any{"task_id", e.TaskID}, attrs...)
		}
		switch e.Kind {
		case breakerKindTransition:
			k.transitionsTotal.WithLabelValues(string(e.Scope), string(e.To)).Inc()
			k.log.Warn("breaker "+string(e.To), append(attrs, "from", e.From, "to", e.To, "failures", e.Failures, "requests", e.Requests)...)
		default:
			k.alertsTotal.WithLabelValues(string(e.Class)).Inc()
			k.log.Warn("alert", append(attrs, "class", e.Class)...)
		}
	}
	k.gauges()
}

// Rollback undoes the breaker changes of a batch whose transaction did not
// commit.
func (k *Breakers) Rollback() {
	k.table.giveBack(k.adopting)
	k.table.dirtyAgain(k.checked)
	clear(k.batch)
	k.set.Rollback()
	k.surges.Rollback()
	k.held.rollback()
	if k.savedClosed != nil {
		k.closed = k.savedClosed
	}
	if k.savedAdoptedReset != nil {
		k.adoptedReset = k.savedAdoptedReset
	}
	k.heldUntil = k.savedHeldUntil
	k.pruned = k.savedPruned
	k.heldGauge.Set(float64(k.held.len()))
	k.gauges()
}

// gauges sets faultrouter_breakers from the set's counts.
func (k *Breakers) gauges() {
	items, _ := k.latchCounts()
	k.latchItemsGauge.Set(float64(items))
	c := k.set.Counts()
	for _, sc := range breaker.Scopes {
		for _, st := range breaker.States {
			k.states.WithLabelValues(sc.String(), st.String()).Set(float64(c[sc][st]))
		}
	}
}
