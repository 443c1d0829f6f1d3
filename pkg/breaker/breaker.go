// Package breaker holds faultrouter's circuit breakers as pure state
// machines: rolling-window failure counting per key, CLOSED -> OPEN ->
// HALF_OPEN -> CLOSED with a cooldown and half-open probes. It does no I/O
// and reads no clock: every call takes the time, and every state change is
// returned as a Transition for the caller to publish.
//
// A Set lives in the memory of one router instance. Its shared part (state,
// latch, opening time: Shared) is what the router writes to the breakers
// topic and what another instance, or a restarted one, takes over with
// Adopt; the rolling windows are each instance's own. Begin, Commit and
// Rollback make the changes of one batch a unit that can be undone when its
// transaction aborts.
package breaker

import (
	"fmt"
	"sort"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// State is a breaker state.
type State uint8

// States.
const (
	// Closed lets everything through and counts failures in the window.
	Closed State = iota
	// Open lets no retry through until the cooldown has passed.
	Open
	// HalfOpen lets Config.HalfOpenProbes retries through as probes; that many
	// successes close the breaker, one failure re-opens it. Probes whose
	// outcomes have not all come a cooldown after the last went out (its
	// worker died with it, or never reports) are replaced: the breaker
	// half-opens again and lets as many new probes through.
	HalfOpen
)

// States lists every State, in order.
var States = []State{Closed, Open, HalfOpen}

// Name is the state as records write it.
func (s State) Name() event.BreakerStateName {
	switch s {
	case Closed:
		return event.BreakerClosed
	case Open:
		return event.BreakerOpen
	case HalfOpen:
		return event.BreakerHalfOpen
	}
	return event.BreakerStateName(fmt.Sprintf("State(%d)", uint8(s)))
}

func (s State) String() string { return string(s.Name()) }

// Scope is what a breaker guards.
type Scope uint8

// Scopes.
const (
	// ProviderModel keys are "provider/model".
	ProviderModel Scope = iota
	// Downstream keys are the event's action: the business system the worker
	// acts on (refund, contract_review). The action, not the emitting source,
	// because one worker (source) calls several downstream systems and a
	// failing downstream should not stop the worker's other actions.
	Downstream
	// PromptTemplate keys are the prompt template ID.
	PromptTemplate
)

// Scopes lists every Scope, in order.
var Scopes = []Scope{ProviderModel, Downstream, PromptTemplate}

// Name is the scope as records write it.
func (s Scope) Name() event.BreakerScope {
	switch s {
	case ProviderModel:
		return event.ScopeProviderModel
	case Downstream:
		return event.ScopeDownstream
	case PromptTemplate:
		return event.ScopePromptTemplate
	}
	return event.BreakerScope(fmt.Sprintf("Scope(%d)", uint8(s)))
}

func (s Scope) String() string { return string(s.Name()) }

// ParseState returns the State named s (its String), and false for a name
// that is none.
func ParseState(s event.BreakerStateName) (State, bool) {
	for _, st := range States {
		if st.Name() == s {
			return st, true
		}
	}
	return Closed, false
}

// Scopes of the alerts that are about no breaker (the Scope of an
// event.BreakerEvent of kind ALERT), beside the breaker scopes' names
// (Scope.String).
const (
	// ScopeTask: an alert about one task (its budget exhausted, its review
	// item past its owner's SLA); the key is the task ID.
	ScopeTask event.BreakerScope = "TASK"
	// ScopeTopic: an alert about a topic (its partition count changed);
	// the key is the topic.
	ScopeTopic event.BreakerScope = "TOPIC"
	// ScopeRegistry: an alert about the schema registry (it did not
	// answer); the key is its URL without credentials.
	ScopeRegistry event.BreakerScope = "REGISTRY"
)

// ParseScope returns the Scope named s.
func ParseScope(s event.BreakerScope) (Scope, error) {
	for _, sc := range Scopes {
		if sc.Name() == s {
			return sc, nil
		}
	}
	return 0, fmt.Errorf("breaker: unknown scope %q (allowed: %v)", s, Scopes)
}

// Config is the rolling window and thresholds of the breakers of one scope.
type Config struct {
	// Window is the rolling window failures are counted in. Must be > 0.
	Window time.Duration
	// MinRequests is the fewest outcomes in the window before the breaker may
	// open. Must be >= 1.
	MinRequests int32
	// FailureRatio opens the breaker when failures/requests >= it. In (0, 1].
	FailureRatio float64
	// Cooldown is how long the breaker stays OPEN before HALF_OPEN. Must be > 0.
	Cooldown time.Duration
	// HalfOpenProbes is how many retries HALF_OPEN lets through, and how many
	// successes close it. Must be >= 1.
	HalfOpenProbes int32
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Window <= 0:
		return fmt.Errorf("breaker: Window: must be > 0, got %s", c.Window)
	case c.MinRequests < 1:
		return fmt.Errorf("breaker: MinRequests: must be >= 1, got %d", c.MinRequests)
	case !(c.FailureRatio > 0 && c.FailureRatio <= 1):
		return fmt.Errorf("breaker: FailureRatio: must be in (0, 1], got %v", c.FailureRatio)
	case c.Cooldown <= 0:
		return fmt.Errorf("breaker: Cooldown: must be > 0, got %s", c.Cooldown)
	case c.HalfOpenProbes < 1:
		return fmt.Errorf("breaker: HalfOpenProbes: must be >= 1, got %d", c.HalfOpenProbes)
	}
	return nil
}

// Ref names one breaker.
type Ref struct {
	Scope Scope
	Key   string
}

func (r Ref) String() string { return r.Scope.String() + "/" + r.Key }

// Outcome is one observed result for a breaker.
type Outcome struct {
	Ref
	Failure bool
	// Class and TaskID are carried into the Transition it causes.
	Class  string
	TaskID string
}

// Transition is one state change of one breaker.
type Transition struct {
	Ref
	From, To State
	Reason   string
	// Failures and Requests are the window's counts when it happened.
	Failures, Requests int32
	// Class and TaskID are those of the outcome that caused it; empty for a
	// time-driven transition (cooldown over) or a reset.
	Class  string
	TaskID string
	At     time.Time
}

// buckets is the number of slots of the rolling window.
const buckets = 10

type slot struct {
	start          int64 // slot start, ms; 0 for unused
	requests, fail int32
}

// breaker is one key's state.
type breaker struct {
	state    State
	latched  bool  // opened by Trip: stays OPEN until Reset
	openedAt int64 // ms
	probes   int32 // HALF_OPEN: probes let through
	okProbes int32 // HALF_OPEN: successes seen
	probedAt int64 // HALF_OPEN: when the last probe was let through (ms)
	// wait is, for a state adopted from another instance (Adopt), the time
	// (ms) before which it neither half-opens nor lets a probe through: the
	// instance that wrote the state probes alone meanwhile
	wait   int64
	window [buckets]slot
	saved  uint64 // the unit of changes (Set.epoch) its state at Begin was saved in
	used   int64  // when it last counted an outcome, was asked, or changed (ms): Expire
}

// Set is the breakers of every scope. It is not safe for concurrent use.
type Set struct {
	cfg [3]Config
	// limits gives the Config of a key whose limits are not its scope's
	// (SetLimits); nil: every key has its scope's
	limits   func(Ref) *Config
	breakers RefMap[*breaker]
	// undo holds, between Begin and Commit or Rollback (while unit), each
	// changed breaker as it was at Begin (nil: it did not exist); epoch
	// counts the units, so that a breaker knows it was saved without a
	// look-up in undo
	undo  RefMap[*breaker]
	unit  bool
	epoch uint64
}

// Begin starts a unit of changes: Rollback undoes every change made after
// it, Commit keeps them. A router calls Begin before a batch and Commit once
// the batch's transaction has committed, so that a batch that aborts (and is
// consumed again) leaves its breakers exactly as they were: no outcome
// counted twice, no latch or transition lost, no half-open probe slot used
// up by a probe that was never published.
func (s *Set) Begin() { s.undo.reset(); s.unit, s.epoch = true, s.epoch+1 }

// Commit keeps the changes made since Begin.
func (s *Set) Commit() { s.undo.reset(); s.unit = false }

// Rollback undoes the changes made since Begin.
func (s *Set) Rollback() {
	for ref, old := range s.undo.All {
		if old == nil {
			s.breakers.Delete(ref)
		} else {
			s.breakers.Set(ref, old)
		}
	}
	s.undo.reset()
	s.unit = false
}

// save keeps the state of ref as it was at Begin, before its first change.
func (s *Set) save(ref Ref) {
	if !s.unit {
		return
	}
	if b, ok := s.breakers.Get(ref); ok {
		s.saveFound(ref, b)
	} else if _, ok := s.undo.Get(ref); !ok {
		s.undo.Set(ref, nil)
	}
}

// saveFound is save for b, the breaker of ref.
func (s *Set) saveFound(ref Ref, b *breaker) {
	if !s.unit || b.saved == s.epoch {
		return
	}
	c := *b
	s.undo.Set(ref, &c)
	b.saved = s.epoch
}

// NewSet returns a Set with a Config per scope, indexed by Scope.
func NewSet(providerModel, downstream, promptTemplate Config) (*Set, error) {
	s := &Set{cfg: [3]Config{providerModel, downstream, promptTemplate}}
	for _, sc := range Scopes {
		if err := s.cfg[sc].Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", sc, err)
		}
	}
	return s, nil
}

// MaxBreakers bounds the breakers a Set keeps: keys come from events
// (provider/model, action, template), so a flood of distinct keys must not
// grow memory without limit. At the bound, CLOSED breakers are forgotten
// (those with an empty window first); OPEN and HALF_OPEN ones never are
// (forgetting one would let retries into what it guards, and a latched one
// waits for a person). When the bound is reached with none of them CLOSED,
// a key without a breaker of its own is counted under its scope's overflow
// breaker (OverflowKey): the keys beyond the bound share one breaker, which
// holds all of their retries when it opens, until their own breakers have
// room again. A Set holds at most MaxBreakers breakers and the overflow
// breakers, one per scope.
var MaxBreakers = 10_000

// OverflowKey is the key of a scope's overflow breaker (MaxBreakers).
const OverflowKey = "(overflow)"

// Resolve returns the refs a retry guarded by refs is held behind: each
// ref itself, or its scope's overflow breaker for a key counted there.
func (s *Set) Resolve(refs []Ref) []Ref {
	var out []Ref
	for i, ref := range refs {
		if r := s.lookup(ref); r != ref {
			if out == nil {
				out = append(make([]Ref, 0, len(refs)), refs[:i]...)
			}
			ref = r
		}
		if out != nil {
			out = append(out, ref)
		}
	}
	if out == nil {
		return refs
	}
	return out
}

// lookup returns the ref whose breaker guards ref: ref itself, unless ref
// has no breaker of its own while the set is full and its scope's overflow
// breaker exists.
func (s *Set) lookup(ref Ref) Ref {
	if _, ok := s.breakers.Get(ref); ok || s.breakers.Len() < MaxBreakers {
		return ref
	}
	if o := (Ref{Scope: ref.Scope, Key: OverflowKey}); s.find(o) != nil {
		return o
	}
	return ref
}

// get returns the breaker of ref, and the ref it is kept under: ref itself,
// or its scope's overflow breaker when the set is full of breakers it may
// not forget.
func (s *Set) get(ref Ref, now time.Time) (*breaker, Ref) {
	if b, ok := s.breakers.Get(ref); ok {
		s.saveFound(ref, b)
		b.used = now.UnixMilli()
		return b, ref
	}
	if s.breakers.Len() >= MaxBreakers {
		s.evict(now)
		if s.breakers.Len() >= MaxBreakers && ref.Key != OverflowKey {
			return s.get(Ref{Scope: ref.Scope, Key: OverflowKey}, now)
		}
	}
	s.save(ref)
	b := &breaker{saved: s.epoch, used: now.UnixMilli()} // new in this unit: undo forgets it
	s.breakers.Set(ref, b)
	return b, ref
}

// evict forgets CLOSED breakers: idle ones, or, if none is idle, all of them
// but the overflow breakers.
func (s *Set) evict(now time.Time) {
	n := s.breakers.Len()
	for ref, b := range s.breakers.All {
		if _, req := s.counts(ref, b, now.UnixMilli()); b.state == Closed && req == 0 {
			s.save(ref)
			s.breakers.Delete(ref)
		}
	}
	if s.breakers.Len() < n {
		return
	}
	for ref, b := range s.breakers.All {
		if b.state == Closed && ref.Key != OverflowKey { // an overflow breaker counting failures stays
			s.save(ref)
			s.breakers.Delete(ref)
		}
	}
}

// counts sums the window ending at now.
func (s *Set) counts(ref Ref, b *breaker, now int64) (fail, req int32) {
	return sumSlots(&b.window, s.config(ref).Window, now)
}

func (s *Set) count(ref Ref, b *breaker, now int64, failure bool) {
	countSlots(&b.window, s.config(ref).Window, now, failure)
}

func (s *Set) move(ref Ref, b *breaker, to State, reason string, now time.Time, o *Outcome) Transition {
	s.saveFound(ref, b)
	fail, req := s.counts(ref, b, now.UnixMilli())
	t := Transition{Ref: ref, From: b.state, To: to, Reason: reason, Failures: fail, Requests: req, At: now}
	if o != nil {
		t.Class, t.TaskID = o.Class, o.TaskID
	}
	b.state = to
	b.wait = 0
	switch to {
	case Open:
		b.openedAt = now.UnixMilli()
	case HalfOpen:
		b.probes, b.okProbes = 0, 0
	case Closed:
		b.latched = false
		b.window = [buckets]slot{}
	}
	return t
}

// advance moves an OPEN breaker whose cooldown has passed to HALF_OPEN.
func (s *Set) advance(ref Ref, b *breaker, now time.Time) []Transition {
	if b.state == Open && !b.latched && now.UnixMilli() >= max(b.openedAt+s.config(ref).Cooldown.Milliseconds(), b.wait) {
		return []Transition{s.move(ref, b, HalfOpen, "cooldown over; letting probes through", now, nil)}
	}
	return nil
}

// replaceProbes half-opens a HALF_OPEN breaker again when its probes are
// all out and not all answered a cooldown after the last went out, so that
// it lets as many new probes through. Only Allow asks: probes are replaced
// for a retry that would be one, not on every Tick of a breaker no retry
// waits for.
func (s *Set) replaceProbes(ref Ref, b *breaker, now time.Time) []Transition {
	cfg := s.config(ref)
	ms := now.UnixMilli()
	if b.probes < cfg.HalfOpenProbes || ms < b.wait || ms < b.probedAt+cfg.Cooldown.Milliseconds() {
		return nil
	}
	return []Transition{s.move(ref, b, HalfOpen, fmt.Sprintf("%d of %d probe(s) unanswered %s after the last went out; letting new probes through",
		b.probes-b.okProbes, b.probes, cfg.Cooldown), now, nil)}
}

// Record counts one outcome and returns the transitions it causes (none, or
// a cooldown's OPEN -> HALF_OPEN followed by the outcome's own).
func (s *Set) Record(o Outcome, now time.Time) []Transition {
	b, ref := s.get(o.Ref, now)
	o.Ref = ref
	ts := s.advance(o.Ref, b, now)
	ms := now.UnixMilli()
	s.count(o.Ref, b, ms, o.Failure)
	cfg := s.config(o.Ref)
	switch b.state {
	case Closed:
		fail, req := s.counts(o.Ref, b, ms)
		if o.Failure && cfg.Trips(fail, req) {
			ts = append(ts, s.move(o.Ref, b, Open,
				fmt.Sprintf("%d of %d outcomes failed within %s (ratio >= %v, min %d)", fail, req, cfg.Window, cfg.FailureRatio, cfg.MinRequests), now, &o))
		}
	case HalfOpen:
		if o.Failure {
			ts = append(ts, s.move(o.Ref, b, Open, "a failure while half-open", now, &o))
			break
		}
		b.okProbes++
		if b.okProbes >= cfg.HalfOpenProbes {
			ts = append(ts, s.move(o.Ref, b, Closed, fmt.Sprintf("%d success(es) while half-open", b.okProbes), now, &o))
		}
	case Open:
	}
	return ts
}

// Allow reports whether a retry guarded by every breaker of refs may be
// published now, with the transitions the passing of time caused. An OPEN
// breaker refuses; a HALF_OPEN one lets HalfOpenProbes retries through, and a
// granted retry uses one probe of each HALF_OPEN breaker only when all of refs
// allow it. A HALF_OPEN breaker whose probes are all out, and not all
// answered a cooldown after the last went out, half-opens again (HALF_OPEN
// to HALF_OPEN): an outcome that never comes holds its retries for a
// cooldown, not until they are given up. An outcome of an earlier probe
// that comes later still counts.
func (s *Set) Allow(refs []Ref, now time.Time) (bool, []Transition) {
	var ts []Transition
	ok := true
	refs = s.Resolve(refs)
	for _, ref := range refs {
		b, found := s.breakers.Get(ref)
		if !found {
			continue
		}
		if b.state != Closed && b.used < now.UnixMilli() {
			s.saveFound(ref, b)
			b.used = now.UnixMilli()
		}
		ts = append(ts, s.advance(ref, b, now)...)
		switch b.state {
		case Open:
			ok = false
		case HalfOpen:
			ts = append(ts, s.replaceProbes(ref, b, now)...)
			if b.probes >= s.config(ref).HalfOpenProbes || now.UnixMilli() < b.wait {
				ok = false
			}
		case Closed:
		}
	}
	if ok {
		for _, ref := range refs {
			if b, found := s.breakers.Get(ref); found && b.state == HalfOpen {
				s.saveFound(ref, b)
				b.probes++
				b.probedAt = now.UnixMilli()
			}
		}
	}
	return ok, ts
}

// HoldUntil is when a retry that Allow refused is worth asking about again:
// the end of the cooldown of an OPEN breaker, or, for a HALF_OPEN one with its
// probes out or one latched OPEN, the next recheck, every quarter of the
// cooldown (between 1 s and 30 s) from when it half-opened (or latched). The
// rechecks are the same times for every retry of the breaker, whenever it was
// refused, so that the retries held behind it are asked again together. It is
// the latest over refs, and never before now.
func (s *Set) HoldUntil(refs []Ref, now time.Time) time.Time {
	until := now
	for _, ref := range s.Resolve(refs) {
		b, ok := s.breakers.Get(ref)
		if !ok {
			continue
		}
		cooldown := s.config(ref).Cooldown.Milliseconds()
		var t time.Time
		switch {
		case b.state == Open && !b.latched:
			t = time.UnixMilli(max(b.openedAt+cooldown, b.wait))
		case b.state == HalfOpen && b.wait > now.UnixMilli():
			t = time.UnixMilli(b.wait)
		case b.state == Open, b.state == HalfOpen:
			from := b.openedAt // latched
			if !b.latched {
				from += cooldown
			}
			step := recheck(cooldown)
			t = time.UnixMilli(from + step*(max(now.UnixMilli()-from, 0)/step+1))
		default:
			continue
		}
		if t.After(until) {
			until = t
		}
	}
	return until
}

// Tick moves every OPEN breaker whose cooldown has passed to HALF_OPEN, in
// key order.
func (s *Set) Tick(now time.Time) []Transition {
	var ts []Transition
	for _, ref := range s.sortedRefs() {
		ts = append(ts, s.advance(ref, s.find(ref), now)...)
	}
	return ts
}

// Trip opens a breaker and latches it: it stays OPEN, whatever the cooldown,
// until Reset or Unlatch. It returns no transition for a breaker already
// latched, and OPEN to OPEN for one open on its failure rate (the latch
// alone begins).
func (s *Set) Trip(ref Ref, reason string, o Outcome, now time.Time) []Transition {
	b, ref := s.get(ref, now)
	if b.latched {
		return nil
	}
	var ts []Transition
	if b.state != Open {
		ts = append(ts, s.move(ref, b, Open, reason, now, &o))
	} else {
		s.saveFound(ref, b)
		fail, req := s.counts(ref, b, now.UnixMilli())
		ts = append(ts, Transition{Ref: ref, From: Open, To: Open, Reason: reason, Failures: fail, Requests: req,
			Class: o.Class, TaskID: o.TaskID, At: now})
		b.openedAt = now.UnixMilli()
	}
	b.latched = true
	return ts
}

// Reset closes a breaker (a person's decision), clearing its window.
func (s *Set) Reset(ref Ref, reason string, now time.Time) []Transition {
	ref = s.lookup(ref)
	b, ok := s.breakers.Get(ref)
	if !ok || b.state == Closed {
		return nil
	}
	return []Transition{s.move(ref, b, Closed, reason, now, nil)}
}

// Unlatch ends a breaker's latch without a person's reset (its last item
// was decided) and leaves it in sh, the failure-rate state the instances
// share for it: an OPEN keeps the time it opened there, so the cooldown
// it began before or while the breaker was latched still holds retries; a
// HALF_OPEN lets probes through; a CLOSED closes it, clearing its window.
// It returns the transition it causes (OPEN to OPEN when it stays open: the
// latch alone ended), and nothing for a breaker that is not latched.
func (s *Set) Unlatch(ref Ref, sh Shared, reason string, now time.Time) []Transition {
	ref = s.lookup(ref)
	b, ok := s.breakers.Get(ref)
	if !ok || !b.latched {
		return nil
	}
	s.saveFound(ref, b)
	if sh.State != Open {
		var ts []Transition
		if b.state != sh.State {
			ts = append(ts, s.move(ref, b, sh.State, reason, now, nil))
		}
		b.latched = false
		if sh.State == HalfOpen && sh.Elsewhere {
			b.wait = now.UnixMilli() + s.config(ref).Cooldown.Milliseconds()
		}
		return ts
	}
	b.latched = false
	b.wait = 0
	if !sh.OpenedAt.IsZero() {
		b.openedAt = sh.OpenedAt.UnixMilli()
	}
	if sh.Elsewhere {
		cooldown := s.config(ref).Cooldown.Milliseconds()
		b.wait = b.openedAt + cooldown + recheck(cooldown)
	}
	fail, req := s.counts(ref, b, now.UnixMilli())
	return []Transition{{Ref: ref, From: Open, To: Open, Reason: reason, Failures: fail, Requests: req, At: now}}
}

// State returns the state of a breaker; CLOSED for one never seen.
func (s *Set) State(ref Ref) State {
	if b, ok := s.breakers.Get(s.lookup(ref)); ok {
		return b.state
	}
	return Closed
}

// Counts returns how many breakers are in each state, per scope.
func (s *Set) Counts() [3][3]int {
	var c [3][3]int
	for ref, b := range s.breakers.All {
		c[ref.Scope][b.state]++
	}
	return c
}

func (s *Set) sortedRefs() []Ref {
	refs := make([]Ref, 0, s.breakers.Len())
	for ref := range s.breakers.All {
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Scope != refs[j].Scope {
			return refs[i].Scope < refs[j].Scope
		}
		return refs[i].Key < refs[j].Key
	})
	return refs
}

// Latched reports whether a breaker is latched open (by Trip, until Reset).
func (s *Set) Latched(ref Ref) bool {
	b, ok := s.breakers.Get(s.lookup(ref))
	return ok && b.latched
}

// Shared is the part of a breaker's state that router instances share
// through the breakers topic: its state, whether it is latched, and when it
// opened. The rolling window is not shared: each instance counts the
// outcomes it sees.
type Shared struct {
	State    State
	Latched  bool
	OpenedAt time.Time // zero unless State is Open
	// Elsewhere is true for a state another instance wrote: it probes
	// alone for a while (Adopt). False for this instance's own state,
	// written by an earlier process of it.
	Elsewhere bool
}

// Shared returns the shared state of a breaker: CLOSED for one never seen.
func (s *Set) Shared(ref Ref) Shared {
	b, ok := s.breakers.Get(s.lookup(ref))
	if !ok {
		return Shared{}
	}
	sh := Shared{State: b.state, Latched: b.latched}
	if b.state == Open {
		sh.OpenedAt = time.UnixMilli(b.openedAt)
	}
	return sh
}

// Adopt makes a breaker take the shared state another instance (or an
// earlier process of this one) wrote, keeping its own window, and returns
// the transition it causes (none when the state is the same). An OPEN
// breaker keeps the time it opened there; a CLOSED one clears its latch and
// window. A CLOSED state of a breaker never seen changes nothing.
//
// So that N instances do not send N times the probes, the writer probes
// alone for a while: an adopted OPEN half-opens here only one recheck step
// (a quarter of the cooldown, 1 s to 30 s) after the writer's cooldown ended
// (by then the writer's HALF_OPEN has normally been adopted, when the writer
// holds retries of it), and an adopted HALF_OPEN lets no probe through for a
// cooldown. If the writer is gone, this instance probes then itself.
// A state this instance wrote itself (Shared.Elsewhere false: restored
// after a restart) waits for nothing but its own cooldown.
func (s *Set) Adopt(ref Ref, sh Shared, reason string, now time.Time) []Transition {
	if _, ok := s.breakers.Get(s.lookup(ref)); !ok && sh.State == Closed {
		return nil
	}
	b, ref := s.get(ref, now)
	var ts []Transition
	changed := b.state != sh.State
	if changed {
		ts = append(ts, s.move(ref, b, sh.State, reason, now, nil))
	}
	s.saveFound(ref, b)
	cooldown := s.config(ref).Cooldown.Milliseconds()
	switch sh.State {
	case Open:
		b.latched = sh.Latched
		switch {
		case sh.OpenedAt.IsZero():
		case changed:
			b.openedAt = sh.OpenedAt.UnixMilli()
		default:
			// already OPEN here: another instance's earlier opening does not
			// shorten the cooldown this one began
			b.openedAt = max(b.openedAt, sh.OpenedAt.UnixMilli())
		}
		if changed && sh.Elsewhere {
			b.wait = b.openedAt + cooldown + recheck(cooldown)
		}
	case HalfOpen:
		if changed && sh.Elsewhere {
			b.wait = now.UnixMilli() + cooldown
		}
	case Closed:
	}
	return ts
}

// Idle is how long a breaker of a scope goes unused (no outcome counted,
// no retry asked about, no change) before Expire lets it go: twice its
// cooldown and window, and at least four rechecks (a held retry asks at the
// end of the cooldown and every recheck after). Its key is no longer used.
// A key with limits of its own (SetLimits) waits for IdleOf.
func (s *Set) Idle(sc Scope) time.Duration { return idle(&s.cfg[sc]) }

// IdleOf is Idle of ref's breaker, on its own limits.
func (s *Set) IdleOf(ref Ref) time.Duration { return idle(s.config(ref)) }

// IdleOf is how long a breaker of Config c may go unused before Expire lets
// it go: twice its cooldown and window, and at least four rechecks.
func IdleOf(c Config) time.Duration { return idle(&c) }

func idle(c *Config) time.Duration {
	return max(2*(c.Cooldown+c.Window), 4*time.Duration(recheck(c.Cooldown.Milliseconds()))*time.Millisecond)
}

// SetLimits gives keys limits of their own: limits(ref) is the Config of
// ref's breaker, or nil for its scope's (a policy override's breaker
// limits, policy.Policy.BreakerLimitsFunc). Each Config must be valid; the
// overflow breakers keep their scope's. Call it before the Set is used: a
// breaker's window is laid out on its Config.
func (s *Set) SetLimits(limits func(Ref) *Config) { s.limits = limits }

// config is the Config of ref's breaker.
func (s *Set) config(ref Ref) *Config {
	if s.limits != nil && ref.Key != OverflowKey {
		if c := s.limits(ref); c != nil {
			return c
		}
	}
	return &s.cfg[ref.Scope]
}

// Expire lets go of the breakers not used for Idle, latched ones aside and
// those keep keeps (nil: none; a router keeps the breakers it holds retries
// behind): one OPEN or HALF_OPEN closes (the transitions it returns), and
// each is forgotten, so that keys that came and went (templates, models,
// actions) leave nothing behind. A key used again starts a new breaker,
// CLOSED.
func (s *Set) Expire(now time.Time, keep func(Ref) bool) []Transition {
	var ts []Transition
	ms := now.UnixMilli()
	for _, ref := range s.sortedRefs() {
		b := s.find(ref)
		if b.latched || ms-b.used < s.IdleOf(ref).Milliseconds() || keep != nil && keep(ref) {
			continue
		}
		if b.state != Closed {
			ts = append(ts, s.move(ref, b, Closed, fmt.Sprintf("unused for %s: let go", s.IdleOf(ref)), now, nil))
		}
		s.save(ref)
		s.breakers.Delete(ref)
	}
	return ts
}

// Len returns the number of breakers the set holds.
func (s *Set) Len() int { return s.breakers.Len() }

// find returns the breaker of ref, nil when it has none.
func (s *Set) find(ref Ref) *breaker {
	b, _ := s.breakers.Get(ref)
	return b
}

// recheck is the step at which retries held behind a breaker that is
// latched, or half-open with its probes out, are asked again: a quarter of
// the cooldown (ms), between 1 s and 30 s.
func recheck(cooldown int64) int64 {
	return min(max(cooldown/4, time.Second.Milliseconds()), 30*time.Second.Milliseconds())
}
