package router

// breakers.go connects the circuit breakers (pkg/breaker) to the data path:
// observe feeds every decided task event into the breakers of its
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
//     (releaseHeld), in due order with the others, without waiting for the
//     time it was moved to: before any retry that comes due after the close.
// While a template breaker is latched open by a hallucination, its retries
// are held until a person resets it, on every instance and across restarts
// (the breakers topic keeps the latch); a reviewer's decision of a
// hallucination's item is that reset only once every other open item of a
// hallucination of that template is decided too (latchitems.go).
//
// Latches and resets reach every instance as commands on the decisions
// topic: the instance that latches a breaker (or routes the review decision
// that resets it) writes a LATCH (or RESET) BreakerEvent to every decisions
// partition in the batch's transaction; each partition's owner applies it
// (breakerCommand) and audits it.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BreakerEvent kinds and the scope of a per-task alert.
const (
	breakerKindTransition = event.BreakerKindTransition
	breakerKindAlert      = event.BreakerKindAlert
	scopeTask             = breaker.ScopeTask
)

// breakers is the router's breaker set, its metrics and the retries it holds.
type breakers struct {
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
	heldUntil map[breaker.Ref]int64
	// pruned is the count of rebalances (Router.rebalances) when the held
	// retries of partitions this instance no longer owns were last let go
	pruned uint64
	// closed, heldUntil and pruned as they were when the batch began (held
	// keeps its own undo log)
	savedPruned    uint64
	savedClosed    map[breaker.Ref]bool
	savedHeldUntil map[breaker.Ref]int64
	// refs is observe's scratch: the breakers of the event it observes
	refs []breaker.Ref

	// table reads the breakers topic (breakertable.go); nil without one.
	// adopting are the states it gave the batch (adoptShared), given back
	// if the batch does not commit
	table    *breakerTable
	adopting map[breaker.Ref]event.BreakerState
	// lastChange and lastReset are, per breaker, the time (Unix ms) of the
	// latest change and person's reset made or adopted here: an older state
	// from the topic is not adopted. They are not undone with a batch that
	// does not commit: that batch is consumed again and makes its changes
	// again.
	lastChange map[breaker.Ref]int64
	lastReset  map[breaker.Ref]int64
	// items are the open review items of the hallucinations that latched a
	// template (latchitems.go)
	items *latchItems

	states      *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	alerts      *prometheus.CounterVec
	heldGauge   prometheus.Gauge
}

func breakerConfig(b policy.Breaker) breaker.Config {
	return breaker.Config{
		Window:         time.Duration(b.WindowMs) * time.Millisecond,
		MinRequests:    b.MinRequests,
		FailureRatio:   b.FailureRatio,
		Cooldown:       time.Duration(b.CooldownMs) * time.Millisecond,
		HalfOpenProbes: b.HalfOpenProbes,
	}
}

func newBreakers(p *policy.Policy, reg prometheus.Registerer) (*breakers, error) {
	set, err := breaker.NewSet(breakerConfig(p.Breakers.ProviderModel), breakerConfig(p.Breakers.Downstream),
		breakerConfig(p.Breakers.PromptTemplate))
	if err != nil {
		return nil, fmt.Errorf("router: Policy.Breakers: %w", err)
	}
	surges, err := newSurges(p.Surge)
	if err != nil {
		return nil, fmt.Errorf("router: Policy.Surge: %w", err)
	}
	const ns = "faultrouter"
	b := &breakers{
		set:        set,
		surges:     surges,
		held:       newHeldSet(),
		closed:     map[breaker.Ref]bool{},
		heldUntil:  map[breaker.Ref]int64{},
		lastChange: map[breaker.Ref]int64{},
		lastReset:  map[breaker.Ref]int64{},
		items:      newLatchItems(),
		states: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "breakers",
			Help: "Circuit breakers of this instance by scope and state."}, []string{"scope", "state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "breaker_transitions_total",
			Help: "Circuit breaker transitions, by scope and the state entered."}, []string{"scope", "to"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "alerts_total",
			Help: "Alerts (hallucination, budget exhausted, surge) written to the alerts topic, by class."}, []string{"class"}),
		heldGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "retries_held",
			Help: "Due retries held because a breaker they would be published into is open."}),
	}
	for _, sc := range breaker.Scopes {
		for _, st := range breaker.States {
			b.states.WithLabelValues(sc.String(), st.String()).Set(0)
		}
	}
	if reg != nil {
		reg.MustRegister(b.states, b.transitions, b.alerts, b.heldGauge)
	}
	return b, nil
}

func newSurges(p policy.Surge) (*breaker.Surges, error) {
	cfg := breaker.SurgeConfig{Window: time.Duration(p.WindowMs) * time.Millisecond, MinEvents: p.MinEvents, Ratio: p.Ratio}
	for _, c := range p.Classes {
		cfg.Classes = append(cfg.Classes, string(c))
	}
	for _, s := range p.Scopes {
		sc, err := breaker.ParseScope(s)
		if err != nil {
			return nil, err
		}
		cfg.Scopes = append(cfg.Scopes, sc)
	}
	return breaker.NewSurges(cfg)
}

// observe feeds a decided task event into its breakers and queues the
// BreakerEvents of the transitions and immediate alerts it causes.
func (r *Router) observe(in *input, b *batch, now time.Time) {
	if in.kind == inputReview {
		r.reviewed(in, b, now)
		return
	}
	if in.kind != inputTask || in.decision.Route == event.RouteDrop {
		return
	}
	ev, d := &in.event, &in.decision
	refs := policy.AppendBreakerRefs(r.brk.refs[:0], ev)
	r.brk.refs = refs
	for _, ref := range refs {
		if o, ok := policy.BreakerOutcome(ref, ev, d.Class); ok {
			r.transitions(r.brk.set.Record(o, now), b, now)
		}
	}
	r.surge(ev, refs, d.Class, b, now)
	if ev.PromptTemplate != "" && !policy.HoldsLatchItem(b.states[ev.TaskID]) {
		ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: ev.PromptTemplate}
		if r.brk.items.has(event.BreakerItemKey(ref.Scope.String(), ref.Key, ev.TaskID)) {
			r.shareItem(ref, ev.TaskID, false, b, now) // a re-drive cleared the task's item
		}
	}
	switch d.Class {
	case event.ClassHallucination:
		key := ev.PromptTemplate
		if key == "" {
			key = "(none)"
		}
		r.alert(b, now, codec.AlertQuarantined, event.BreakerEvent{Scope: breaker.PromptTemplate.String(), Key: key, Kind: breakerKindAlert,
			Reason: "output quarantined: " + d.Reason, Class: d.Class, TaskID: ev.TaskID})
		if ref, ok := policy.LatchesTemplate(ev, d.Class); ok {
			r.latch(ref, "MODEL_HALLUCINATION: open until a person resets it", string(d.Class), ev.TaskID, b, now)
			r.shareItem(ref, ev.TaskID, true, b, now)
		}
	case event.ClassBudgetExhausted:
		r.alert(b, now, codec.AlertBudget, event.BreakerEvent{Scope: scopeTask, Key: ev.TaskID, Kind: breakerKindAlert,
			Reason: d.Reason, Class: d.Class, TaskID: ev.TaskID})
	}
}

// surge feeds a decided task event into the surge detector of its prompt
// template and provider/model (refs: policy.BreakerRefs of the event) and
// queues an ALERT for a surge it starts.
func (r *Router) surge(ev *event.TaskEvent, refs []breaker.Ref, class event.Class, b *batch, now time.Time) {
	for _, ref := range refs {
		s, fired := r.brk.surges.Record(ref, string(class), ev.TaskID, now)
		if fired {
			r.alert(b, now, codec.AlertSurge, event.BreakerEvent{Scope: s.Scope.String(), Key: s.Key, Kind: breakerKindAlert,
				Reason: s.Reason, Class: class, Failures: s.Count, Requests: s.Total, TaskID: ev.TaskID})
		}
	}
}

// reviewed closes the prompt template breaker a hallucination latched open
// once a person decided its review item (approved or rejected) and no other
// item of a hallucination of that template is open (latchitems.go): that is
// the person's reset. While others are, the template stays latched (the
// console says so on each item). A decision for an item
// already closed changes nothing. The reset reaches every instance as a
// RESET command on every decisions partition.
func (r *Router) reviewed(in *input, b *batch, now time.Time) {
	st := b.states[in.review.TaskID]
	if st == nil {
		return
	}
	ref, ok := policy.ReviewResetsTemplate(&in.decision, st.LastEvent)
	if !ok {
		return
	}
	r.shareItem(ref, in.review.TaskID, false, b, now)
	if !r.brk.set.Latched(ref) {
		return // reset by hand since: nothing holds it any more
	}
	if others := r.brk.items.holding(ref, in.review.TaskID); len(others) > 0 {
		r.log.Info("template stays latched: other hallucination items are open", "task_id", in.review.TaskID,
			"prompt_template", ref.Key, "open_items", len(others))
		return
	}
	who := in.review.Reviewer
	if who == "" {
		who = "a reviewer"
	}
	reason := fmt.Sprintf("%s decided the MODEL_HALLUCINATION item of task %s: %s", who, in.review.TaskID, in.review.Reason)
	ts := r.brk.set.Reset(ref, reason, now)
	for i := range ts {
		ts[i].TaskID, ts[i].Class = in.review.TaskID, string(in.decision.Class)
	}
	r.transitionEvents(ts, b)
	r.share(ref, reason, true, b, now)
	r.broadcast(b, event.BreakerEvent{Scope: ref.Scope.String(), Key: ref.Key, Kind: event.BreakerKindReset,
		Reason: reason, Class: in.decision.Class, TaskID: in.review.TaskID, Instance: who, At: event.At(now)})
}

// latch latches a breaker open until a person resets it and, when this
// instance had not latched it yet, writes a LATCH command to every
// decisions partition in the batch's transaction, so that every instance
// holds the retries of that breaker, not only the one that saw the cause.
func (r *Router) latch(ref breaker.Ref, reason, class, taskID string, b *batch, now time.Time) {
	if r.brk.set.Latched(ref) {
		return
	}
	r.transitionEvents(r.brk.set.Trip(ref, reason, breaker.Outcome{Class: class, TaskID: taskID}, now), b)
	r.share(ref, reason, false, b, now)
	r.broadcast(b, event.BreakerEvent{Scope: ref.Scope.String(), Key: ref.Key, Kind: event.BreakerKindLatch,
		Reason: reason, Class: event.Class(class), TaskID: taskID, Instance: r.cfg.InstanceID, At: event.At(now)})
}

// broadcast queues a breaker command on every partition of the decisions
// topic: each partition's owner applies it, so every instance does.
func (r *Router) broadcast(b *batch, c event.BreakerEvent) {
	v, err := r.codec.EncodeBreakerEvent(nil, &c)
	if err != nil { // only a bug can get here: every field is the router's own
		r.log.Error("breaker command does not encode", "task_id", c.TaskID, "err", err)
		return
	}
	for p := range r.seen.decisions {
		b.out = append(b.out, &kgo.Record{Topic: r.cfg.Topics.Decisions, Partition: p,
			Key: []byte(c.Scope + "/" + c.Key), Value: v, Timestamp: c.At.Time})
	}
}

// BreakerKindReset is the kind of the BreakerEvent that `faultrouter breaker
// reset` writes to every partition of the decisions topic: a person closing a
// breaker (for example a prompt template latched open by a hallucination).
const BreakerKindReset = event.BreakerKindReset

// breakerCommand applies a RESET or LATCH command from the decisions topic
// to this instance's breaker and returns its decision (policy.BreakerCommand):
// every instance gets the command on each decisions partition it owns; a
// repeated command changes nothing.
func (r *Router) breakerCommand(in *input, b *batch, now time.Time) event.Decision {
	c := &in.command
	ref, invalid := policy.BreakerCommand(c, now)
	if invalid != nil {
		return *invalid
	}
	who := c.Instance
	if who == "" {
		who = "an operator"
	}
	var ts []breaker.Transition
	changed := false
	switch c.Kind {
	case event.BreakerKindLatch:
		if !r.brk.set.Latched(ref) {
			reason := fmt.Sprintf("latched by %s: %s", who, c.Reason)
			ts = r.brk.set.Trip(ref, reason, breaker.Outcome{Class: string(c.Class), TaskID: c.TaskID}, now)
			r.share(ref, reason, false, b, now)
			changed = true
		}
	default:
		reason := fmt.Sprintf("%s reset the breaker: %s", who, c.Reason)
		ts = r.brk.set.Reset(ref, reason, now)
		for i := range ts {
			ts[i].TaskID, ts[i].Class = c.TaskID, string(c.Class)
		}
		changed = len(ts) > 0
		if changed {
			r.share(ref, reason, true, b, now)
		}
		// the reset releases the latch items open when it was made
		for _, id := range r.brk.items.openedBy(ref, c.At.UnixMilli()) {
			r.shareItem(ref, id, false, b, now)
		}
	}
	r.transitionEvents(ts, b)
	return policy.BreakerCommandApplied(c, ref, changed, now)
}

// holdRetry reports whether the due retry of ev must stay pending because a
// breaker it would be published into is open (or half-open with its probes
// out). A retry it lets through a half-open breaker is that breaker's probe.
func (r *Router) holdRetry(ev *event.TaskEvent, b *batch, now time.Time) bool {
	if ev == nil {
		return false
	}
	refs := r.brk.set.Resolve(policy.BreakerRefs(ev)) // a key beyond breaker.MaxBreakers is held behind its overflow breaker
	// retries held before this one behind one of its breakers that is not
	// closed, not yet asked again: it waits with them (and does not take a
	// half-open breaker's probe from them)
	behind := r.brk.heldBehind(refs, now)
	ok := behind == 0
	if ok {
		var ts []breaker.Transition
		ok, ts = r.brk.set.Allow(refs, now)
		r.transitions(ts, b, now)
	}
	_, wasHeld := r.brk.held.get(ev.TaskID)
	switch {
	case !ok && !wasHeld:
		r.brk.held.put(ev.TaskID, b.partOf[ev.TaskID], refs)
		msg := "retry held: breaker open"
		if behind != 0 {
			msg = "retry held: behind retries held before it"
		}
		r.log.Info(msg, "task_id", ev.TaskID, "provider", ev.Provider, "model", ev.Model,
			"action", ev.Action, "prompt_template", ev.PromptTemplate)
	case ok && wasHeld:
		r.brk.held.del(ev.TaskID)
		r.log.Info("held retry released", "task_id", ev.TaskID, "provider", ev.Provider, "model", ev.Model)
	}
	if !ok {
		r.postpone(ev, refs, behind, b, now)
	}
	r.brk.heldGauge.Set(float64(r.brk.held.len()))
	return !ok
}

// holdAhead holds, as soon as it is decided, a retry that its breakers will
// still refuse when it comes due: one of them is OPEN past its due time (an
// open breaker stays open until its cooldown ends, unless a person resets
// it), or retries held before it behind one of them that is not closed wait
// past its due time. Its due time is moved at once where holdRetry would move
// it then, computed at its due time (postpone), so that its state is written
// once, not read back by the sweep a second or so later only to be held and
// written again. Under an outage, when breakers are open, that was most of
// the router's work per event. If its breakers close before it comes due,
// releaseHeld moves it back to its own due time.
func (r *Router) holdAhead(ev *event.TaskEvent, b *batch, now time.Time) {
	st := b.states[ev.TaskID]
	if st == nil || st.Pending == nil || st.Pending.NotBefore <= now.UnixMilli() {
		return
	}
	due := st.Pending.NotBefore
	at := time.UnixMilli(due)
	refs := r.brk.set.Resolve(policy.BreakerRefs(ev)) // a key beyond breaker.MaxBreakers is held behind its overflow breaker
	behind := r.brk.heldBehind(refs, at)
	refused := behind != 0
	for _, ref := range refs {
		if !refused && r.brk.set.State(ref) == breaker.Open && r.brk.set.HoldUntil([]breaker.Ref{ref}, at).UnixMilli() > due {
			refused = true
		}
	}
	if !refused {
		return // its breakers may let it through when it comes due: holdRetry decides then
	}
	if _, held := r.brk.held.get(ev.TaskID); !held {
		r.brk.held.put(ev.TaskID, b.partOf[ev.TaskID], refs)
		r.log.Info("retry held ahead of its due time: breaker open", "task_id", ev.TaskID, "provider", ev.Provider, "model", ev.Model,
			"action", ev.Action, "prompt_template", ev.PromptTemplate, "due", at)
	}
	r.postpone(ev, refs, behind, b, at)
	r.brk.heldGauge.Set(float64(r.brk.held.len()))
}

// postpone moves a held retry's due time to when its breakers are worth
// asking again (or, behind retries held before it, to theirs), so that a held
// retry is neither re-read and re-written on every tick nor in front of other
// due retries of its partition. The retry keeps its own due time (DueAt),
// which orders it among the retries moved to the same time.
func (r *Router) postpone(ev *event.TaskEvent, refs []breaker.Ref, behind int64, b *batch, now time.Time) {
	if r.brk.heldUntil == nil {
		r.brk.heldUntil = map[breaker.Ref]int64{}
	}
	for _, ref := range refs {
		if s := r.brk.set.State(ref); s == breaker.Open || s == breaker.HalfOpen {
			own := r.brk.set.HoldUntil([]breaker.Ref{ref}, now).UnixMilli()
			r.brk.heldUntil[ref] = max(r.brk.heldUntil[ref], own)
		}
	}
	st := b.states[ev.TaskID]
	if st == nil || st.Pending == nil {
		return
	}
	until := max(r.brk.set.HoldUntil(refs, now).UnixMilli(), behind)
	if p := st.Pending; until > p.NotBefore {
		p.DueAt = p.Due()
		p.NotBefore = until
	}
}

// heldBehind is the latest time retries held behind one of refs that is not
// closed were moved to, when it is still to come, else 0. (The retries held
// behind a breaker that has closed are released at once: releaseHeld.)
func (k *breakers) heldBehind(refs []breaker.Ref, now time.Time) int64 {
	var until int64
	for _, ref := range refs {
		if u := k.heldUntil[ref]; u > now.UnixMilli() && k.set.State(ref) != breaker.Closed {
			until = max(until, u)
		}
	}
	return until
}

// releaseHeld makes the retries held behind breakers that have all closed
// since due now, in the order of their own due times, so that this batch
// publishes them (publishDue) before any retry due after them, rather than
// leaving them to wait for the time their breakers were to be asked again.
// A retry whose task has moved on (its held retry superseded or published,
// its partition no longer this instance's) is forgotten.
//
// Its cost is that of the retries it may release: it looks only at the
// retries held behind a breaker that has closed since the last sweep (a
// retry is held while one of its breakers is not closed, so the last of them
// to close is among those), and reads their states in one sorted pass.
func (r *Router) releaseHeld(b *batch, now time.Time) error {
	if len(r.brk.closed) == 0 {
		return nil
	}
	ids := r.brk.held.behind(r.brk.closed)
	clear(r.brk.closed)
	if len(ids) == 0 {
		return nil
	}
	nowMs := now.UnixMilli()
	owned := map[int32]bool{}
	for _, p := range r.ownedPartitions() {
		owned[p] = true
	}
	type release struct {
		st *task.State
		p  int32
	}
	var (
		rel    []release
		toLoad []string
		cand   []string
	)
	for _, id := range ids {
		h, _ := r.brk.held.get(id)
		if r.brk.held.anyNot(h, func(ref breaker.Ref) bool { return r.brk.set.State(ref) == breaker.Closed }) {
			continue
		}
		if !owned[h.partition] {
			r.brk.held.del(id)
			continue
		}
		cand = append(cand, id)
		if _, ok := b.states[id]; !ok {
			toLoad = append(toLoad, id)
		}
	}
	stored := make(map[string]*task.State, len(toLoad))
	partOf := func(id string) int32 {
		h, _ := r.brk.held.get(id)
		return h.partition
	}
	if err := r.store.Load(toLoad, partOf, stored); err != nil {
		return err
	}
	for _, id := range cand {
		st, ok := b.states[id]
		if !ok {
			st = stored[id]
		}
		// a retry moved by a breaker keeps its own due time: any other
		// pending retry is a new one
		if st == nil || st.Pending == nil || st.Pending.DueAt == 0 {
			r.brk.held.del(id)
			continue
		}
		if st.Pending.NotBefore > nowMs {
			h, _ := r.brk.held.get(id)
			rel = append(rel, release{st, h.partition})
		}
	}
	slices.SortFunc(rel, func(x, y release) int {
		return cmp.Or(cmp.Compare(x.st.Pending.Due(), y.st.Pending.Due()), cmp.Compare(x.st.TaskID, y.st.TaskID))
	})
	for _, x := range rel {
		b.load(x.st, x.p)
		// a retry held ahead of its due time (holdAhead) waits for it
		x.st.Pending.NotBefore = max(nowMs, x.st.Pending.DueAt)
	}
	r.brk.heldGauge.Set(float64(r.brk.held.len()))
	return nil
}

// transitions queues one BreakerEvent per transition of this instance's own
// making, and shares the state each leaves on the breakers topic.
func (r *Router) transitions(ts []breaker.Transition, b *batch, now time.Time) {
	r.transitionEvents(ts, b)
	for _, t := range ts {
		r.share(t.Ref, t.Reason, false, b, now)
	}
}

// transitionEvents queues one BreakerEvent per transition.
func (r *Router) transitionEvents(ts []breaker.Transition, b *batch) {
	r.transitionEventsFrom(ts, b, "")
}

// transitionEventsFrom queues one BreakerEvent per transition; adoptedFrom,
// when not empty, is the instance whose change on the breakers topic they
// were adopted from (a faultrouter.breaker.adopted_from header).
func (r *Router) transitionEventsFrom(ts []breaker.Transition, b *batch, adoptedFrom string) {
	for _, t := range ts {
		n := len(b.out)
		if t.To == breaker.Closed {
			r.brk.closed[t.Ref] = true
		}
		r.queueBreakerEvent(b, &event.BreakerEvent{Scope: t.Scope.String(), Key: t.Key, Kind: breakerKindTransition,
			From: t.From.String(), To: t.To.String(), Reason: t.Reason, Class: event.Class(t.Class),
			Failures: t.Failures, Requests: t.Requests, TaskID: t.TaskID, Instance: r.cfg.InstanceID, At: event.At(t.At)})
		for _, rec := range b.out[n:] {
			if adoptedFrom != "" {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderBreakerAdoptedFrom, Value: []byte(adoptedFrom)})
			}
			latched := "false"
			if t.To == breaker.Open && r.brk.set.Latched(t.Ref) {
				latched = "true"
			}
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte(latched)})
		}
	}
}

// alert queues an immediate alert; kind is what it is about (a
// codec.Alert* value, its faultrouter.alert header).
func (r *Router) alert(b *batch, now time.Time, kind string, e event.BreakerEvent) {
	e.Instance, e.At = r.cfg.InstanceID, event.At(now)
	n := len(b.out)
	r.queueBreakerEvent(b, &e)
	for _, rec := range b.out[n:] {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(kind)})
	}
}

func (r *Router) queueBreakerEvent(b *batch, e *event.BreakerEvent) {
	v, err := r.codec.EncodeBreakerEvent(nil, e)
	if err != nil { // only a bug can get here: every field is the router's own
		r.log.Error("breaker event does not encode", "task_id", e.TaskID, "err", err)
		return
	}
	b.out = append(b.out, &kgo.Record{Topic: r.cfg.Topics.Alerts, Key: []byte(e.Scope + "/" + e.Key), Value: r.framer.Frame(r.cfg.Topics.Alerts, v)})
	b.breakerEvents = append(b.breakerEvents, *e)
}

// beginBreakers starts the batch's unit of breaker changes: they take effect
// only when the batch's transaction commits (commitBreakers); a batch that
// aborts or fails is consumed again, so its changes are undone
// (rollbackBreakers) and made again, and so are its transitions and alerts.
func (r *Router) beginBreakers() {
	r.brk.set.Begin()
	r.brk.surges.Begin()
	r.brk.held.begin()
	r.brk.items.begin()
	r.brk.savedClosed = maps.Clone(r.brk.closed)
	// a time that has passed holds no more retries: forget it
	nowMs := r.cfg.Now().UnixMilli()
	maps.DeleteFunc(r.brk.heldUntil, func(_ breaker.Ref, until int64) bool { return until < nowMs })
	r.brk.savedHeldUntil = maps.Clone(r.brk.heldUntil)
	r.brk.savedPruned = r.brk.pruned
	r.pruneHeld()
	r.brk.pruneChanges(time.UnixMilli(nowMs))
}

// pruneHeld lets go of the retries held for partitions that moved away,
// once after each rebalance, when the assignment is restored. An eager
// rebalance revokes every partition before it assigns them again, and the
// owned set is empty in between: pruned then, the retries held for the
// partitions that stay would come out at the times they were moved to
// rather than in their due order when their breaker closes. The callbacks
// count a rebalance (rebalances) before they change the owned set and clear
// the ready flag before that, so a rebalance that changed them while they
// were read shows in the count.
func (r *Router) pruneHeld() {
	rb := r.rebalances.Load()
	if rb == r.brk.pruned || !r.Ready() {
		return
	}
	owned := map[int32]bool{}
	for _, p := range r.ownedPartitions() {
		owned[p] = true
	}
	if r.rebalances.Load() != rb {
		return
	}
	r.brk.held.keepPartitions(owned)
	r.brk.pruned = rb
}

// commitBreakers keeps the batch's breaker changes once its transaction has
// committed, and logs and counts its transitions and alerts: only committed
// ones.
func (r *Router) commitBreakers(b *batch) {
	r.brk.adopting = nil
	r.brk.set.Commit()
	r.brk.surges.Commit()
	r.brk.held.commit()
	r.brk.items.commit()
	for i := range b.breakerEvents {
		e := &b.breakerEvents[i]
		attrs := []any{"scope", e.Scope, "key", e.Key, "reason", e.Reason}
		if e.TaskID != "" { // a cooldown or a reset has no triggering task
			attrs = append([]any{"task_id", e.TaskID}, attrs...)
		}
		switch e.Kind {
		case breakerKindTransition:
			r.brk.transitions.WithLabelValues(e.Scope, e.To).Inc()
			r.log.Warn("breaker "+e.To, append(attrs, "from", e.From, "to", e.To, "failures", e.Failures, "requests", e.Requests)...)
		default:
			r.brk.alerts.WithLabelValues(string(e.Class)).Inc()
			r.log.Warn("alert", append(attrs, "class", e.Class)...)
		}
	}
	r.breakerGauges()
}

// rollbackBreakers undoes the breaker changes of a batch whose transaction
// did not commit.
func (r *Router) rollbackBreakers() {
	if r.brk.adopting != nil {
		r.brk.table.giveBack(r.brk.adopting)
		r.brk.adopting = nil
	}
	r.brk.set.Rollback()
	r.brk.surges.Rollback()
	r.brk.held.rollback()
	r.brk.items.rollback()
	if r.brk.savedClosed != nil {
		r.brk.closed = r.brk.savedClosed
	}
	r.brk.heldUntil = r.brk.savedHeldUntil
	r.brk.pruned = r.brk.savedPruned
	r.brk.heldGauge.Set(float64(r.brk.held.len()))
	r.breakerGauges()
}

func (r *Router) breakerGauges() {
	c := r.brk.set.Counts()
	for _, sc := range breaker.Scopes {
		for _, st := range breaker.States {
			r.brk.states.WithLabelValues(sc.String(), st.String()).Set(float64(c[sc][st]))
		}
	}
}
