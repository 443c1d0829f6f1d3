package checker

import (
	"cmp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Breaker windows depend on how the partitions' traffic interleaves in each
// instance, so this file does not predict transitions (missing.go checks
// the trips that had to happen whatever the interleaving): it checks that
// those on the alerts topic are consistent with each other and with the
// audit stream, per instance process. A transition names its instance; a
// retry record is tied to its instance by its producer ID (the instance's
// transactional producer, also on its alert records). A process that
// restarted (Options.Starts) begins with every breaker CLOSED in memory and
// takes the states of the breakers topic in its first batch, as transitions
// with a faultrouter.breaker.adopted_from header, like those it takes from
// the other instances while it runs: an adopted transition must follow a
// transition of the same breaker to the same state on some instance (its
// writer), and the cooldown of an adopted OPEN is its writer's. Whether a
// transition latched its breaker, and what an alert is about, are headers
// too (faultrouter.breaker.latched, faultrouter.alert): reasons are prose
// for people and are never parsed.

// transition is a TRANSITION record of the alerts topic.
type transition struct {
	rec *kgo.Record
	e   event.BreakerEvent
}

// breakerKey is one breaker of one instance.
type breakerKey struct {
	instance string
	ref      breaker.Ref
}

// span is a stretch of time a breaker spent in one state, within one
// process of its instance: [from, to), to zero while it lasts.
type span struct {
	state    event.BreakerStateName
	from, to time.Time
	process  int
	latched  bool
	adopted  bool // entered by adopting another instance's state
}

// process is the index of the process of instance that was running at t:
// how many of its starts lie at or before t.
func (c *checker) process(instance string, t time.Time) int {
	n := 0
	for _, s := range c.o.Starts[instance] {
		if !s.After(t) {
			n++
		}
	}
	return n
}

// has reports whether the task was decided with class at t.
func (c *checker) has(task string, t time.Time, class event.Class) bool {
	return slices.Contains(c.decision[decisionKey{task, t.UnixMilli()}], class)
}

// breakers checks every transition and every published retry against the
// breakers' timelines.
func (c *checker) breakers(ts []transition) {
	slices.SortFunc(ts, func(a, b transition) int {
		return cmp.Or(cmp.Compare(a.rec.Partition, b.rec.Partition), cmp.Compare(a.rec.Offset, b.rec.Offset))
	})
	halluc := map[alertKey]bool{}
	c.instances = map[int64]string{}
	for _, rec := range c.logs.Alerts {
		e, err := c.codec.DecodeBreakerEvent(rec.Value)
		if err != nil {
			continue
		}
		c.instances[rec.ProducerID] = e.Instance
		if e.Kind == "ALERT" && alertKind(rec, &e) == codec.AlertQuarantined {
			halluc[alertKey{e.Scope, e.Key, e.TaskID, e.At.UnixMilli()}] = true
		}
	}
	timelines := map[breakerKey][]span{}
	// own is, per breaker and state, the times transitions of an instance's
	// own making entered it: what an adopted transition follows
	own := map[breaker.Ref]map[event.BreakerStateName][]time.Time{}
	for _, t := range ts {
		if sc, err := breaker.ParseScope(t.e.Scope); err == nil && codec.ParseBreakerHeaders(t.rec.Headers).AdoptedFrom == "" {
			ref := breaker.Ref{Scope: sc, Key: t.e.Key}
			if own[ref] == nil {
				own[ref] = map[event.BreakerStateName][]time.Time{}
			}
			own[ref][t.e.To] = append(own[ref][t.e.To], t.e.At.Time)
		}
	}
	for _, t := range ts {
		c.rep.Transitions++
		e := t.e
		sc, err := breaker.ParseScope(e.Scope)
		if err != nil {
			c.violate("breaker.scope", e.TaskID, "transition %d@%d has scope %q", t.rec.Partition, t.rec.Offset, e.Scope)
			continue
		}
		k := breakerKey{e.Instance, breaker.Ref{Scope: sc, Key: e.Key}}
		tl := timelines[k]
		at := e.At.Time
		proc := c.process(e.Instance, at)
		prev := span{state: breaker.Closed.Name(), process: proc}
		if len(tl) > 0 {
			prev = tl[len(tl)-1]
		}
		restarted := prev.process != proc
		if restarted {
			prev = span{state: breaker.Closed.Name(), process: proc}
		}
		if e.From != prev.state {
			c.violate("breaker.chain", e.TaskID, "%s on instance %s: transition %s -> %s at %s, but its last transition left it %s",
				k.ref, e.Instance, e.From, e.To, stamp(at), prev.state)
		}
		if len(tl) > 0 {
			tl[len(tl)-1].to = at
		}
		cfg := c.breakerConfig(k.ref)
		latch := latchedOpen(t)
		isAdopted := codec.ParseBreakerHeaders(t.rec.Headers).AdoptedFrom != ""
		// OPEN to OPEN: the latch alone ended, the breaker stays open on
		// the failure-rate state shared for it
		unlatched := e.From == breaker.Open.Name() && e.To == breaker.Open.Name() && !latchedOpen(t)
		if sc == breaker.PromptTemplate && e.From == breaker.Open.Name() && (e.To == breaker.Closed.Name() || unlatched) {
			// a template goes from OPEN to CLOSED when its latch is let go
			// (a reviewer's decision of an item, the last item decided
			// elsewhere, a RESET), or, not latched, adopting another
			// instance's CLOSED or let go unused: no item may hold it then
			decided := ""
			if c.has(e.TaskID, at, event.ClassHallucination) {
				decided = e.TaskID
			}
			c.released(k.ref, e, at, decided)
		}
		switch {
		case unlatched:
			if !prev.latched {
				c.violate("breaker.chain", e.TaskID, "%s on instance %s: its latch ended at %s, but it was not latched", k.ref, e.Instance, stamp(at))
			}
		case isAdopted:
			// a change another instance made, or a person's RESET record
			closed := e.To == breaker.Closed.Name()
			if !slices.ContainsFunc(own[k.ref][e.To], func(w time.Time) bool { return !w.After(at) }) && !(closed && c.resetWritten(k.ref, at)) {
				c.violate("breaker.cause", e.TaskID, "%s on instance %s adopted %s at %s, but no instance had made that change by then",
					k.ref, e.Instance, e.To, stamp(at))
			}
		case latch && c.latchCommands[decisionKey{e.TaskID, at.UnixMilli()}]:
			// another instance's latch, applied from the LATCH command it wrote
		case latch && !c.has(e.TaskID, at, event.ClassHallucination):
			c.violate("breaker.cause", e.TaskID, "%s on instance %s latched at %s by task %s, which has neither a MODEL_HALLUCINATION decision nor a LATCH command audited then",
				k.ref, e.Instance, stamp(at), e.TaskID)
		case e.To == breaker.Open.Name() && e.TaskID != "":
			if !c.has(e.TaskID, at, e.Class) {
				c.violate("breaker.cause", e.TaskID, "%s opened at %s by task %s (%s), but the task has no %s decision at that time",
					k.ref, stamp(at), e.TaskID, e.Class, e.Class)
			}
			if latch && !halluc[alertKey{breaker.PromptTemplate.Name(), e.Key, e.TaskID, at.UnixMilli()}] {
				c.violate("breaker.latch_alert", e.TaskID, "%s latched open at %s by task %s without its hallucination alert", k.ref, stamp(at), e.TaskID)
			}
		case e.To == breaker.Open.Name():
			c.violate("breaker.cause", e.TaskID, "%s opened at %s without a triggering task", k.ref, stamp(at))
		case e.To == breaker.HalfOpen.Name():
			if prev.state == breaker.Open.Name() && !prev.latched && !prev.adopted && at.Sub(prev.from) < cfg.Cooldown {
				c.violate("breaker.cooldown", e.TaskID, "%s on instance %s half-opened at %s, %s after it opened; cooldown %s",
					k.ref, e.Instance, stamp(at), at.Sub(prev.from), cfg.Cooldown)
			}
			if prev.latched {
				c.violate("breaker.latch", e.TaskID, "%s on instance %s half-opened at %s while latched open by a hallucination", k.ref, e.Instance, stamp(at))
			}
		case e.To == breaker.Closed.Name() && prev.latched && c.has(e.TaskID, at, event.ClassHallucination):
			// a reviewer's decision of a hallucination's item reopened the
			// template (released below)
		case e.To == breaker.Closed.Name() && e.TaskID != "" && e.Class != event.ClassHallucination:
			// a success while half-open (a reviewer's decision of a
			// hallucination item names its task too)
			if !c.has(e.TaskID, at, event.ClassSucceeded) {
				c.violate("breaker.cause", e.TaskID, "%s closed at %s by task %s, which has no SUCCEEDED decision at that time", k.ref, stamp(at), e.TaskID)
			}
		}
		// after the latch ended the OPEN is the shared one, whose cooldown
		// began before (checked as an adopted one)
		timelines[k] = append(tl, span{state: e.To, from: at, process: proc,
			latched: latch || prev.latched && e.To == breaker.Open.Name() && !unlatched, adopted: isAdopted || unlatched})
	}
	c.retriesVsBreakers(timelines)
	c.letGo(timelines, ts) // letgo.go
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, p := range x.ends() { // a give-up too: it came when the retry could not be published
				c.retryLateness(x, p, timelines) // lifetime.go
			}
		}
	}
}

// retriesVsBreakers checks that no retry was published into an open breaker,
// that a half-open breaker let at most its probes through, and that the
// retries held behind a breaker came out in due order once it closed.
func (c *checker) retriesVsBreakers(timelines map[breakerKey][]span) {
	type pub struct {
		x  *expectRetry
		r  *routed
		at time.Time
	}
	byInstance := map[string][]pub{}
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, p := range x.published {
				if inst, ok := c.instances[p.rec.ProducerID]; ok {
					byInstance[inst] = append(byInstance[inst], pub{x, p, p.at()})
				}
			}
		}
	}
	for k, tl := range timelines {
		pubs := byInstance[k.instance]
		cfg := c.breakerConfig(k.ref)
		for i, s := range tl {
			var in []pub
			for _, p := range pubs {
				if c.process(k.instance, p.at) != s.process || !slices.Contains(p.x.refs, k.ref) {
					continue
				}
				if p.at.Before(s.from) || !s.to.IsZero() && !p.at.Before(s.to) {
					continue
				}
				in = append(in, p)
			}
			switch s.state {
			case breaker.Open.Name():
				for _, p := range in {
					if p.at.After(s.from) {
						c.violate("breaker.retry_into_open", p.x.task, "retry n=%d published at %s into %s, open since %s",
							p.x.n, stamp(p.at), k.ref, stamp(s.from))
					}
				}
			case breaker.HalfOpen.Name():
				if int32(len(in)) > cfg.HalfOpenProbes {
					c.violate("breaker.probes", in[0].x.task, "%s let %d retries through while half-open from %s, probes %d",
						k.ref, len(in), stamp(s.from), cfg.HalfOpenProbes)
				}
			case breaker.Closed.Name():
				if i == 0 {
					continue
				}
				// held behind this breaker alone: due before it closed,
				// published after, every other breaker of the retry closed
				// in between (a retry held behind two breakers waits for both),
				// and decided by the process that publishes it
				var held []pub
				for _, p := range in {
					if p.x.notBefore.Before(s.from) && p.x.decided.Before(s.from) && !heldElsewhere(timelines, k, p.x, p.at) &&
						c.decidedBy(p.x, k.instance, s.process) && !c.joined(p.x.decided, p.at) {
						held = append(held, p)
					}
				}
				slices.SortFunc(held, func(a, b pub) int { return a.x.notBefore.Compare(b.x.notBefore) })
				for i := range held {
					for j := i + 1; j < len(held); j++ {
						a, b := held[i], held[j]
						if a.x.partition == b.x.partition && a.x.notBefore.Before(b.x.notBefore) && a.at.After(b.at) {
							c.violate("breaker.held_order", a.x.task, "%s closed at %s; held retry of %s (due %s) came out at %s, after that of %s (due %s) at %s",
								k.ref, stamp(s.from), a.x.task, stamp(a.x.notBefore), stamp(a.at), b.x.task, stamp(b.x.notBefore), stamp(b.at))
						}
					}
				}
				c.rep.HeldReleased += len(held)
			}
		}
	}
}

// decidedBy reports whether retry x was decided by process proc of
// instance. The held retries are in a process's memory: one that another
// process decided (before a restart, or before its partition moved here)
// and held, moving its time to when its breaker was worth asking again,
// comes out at that time on the process that restored its state, not in
// due order with the retries this process held (docs/data-path.md, Breakers).
func (c *checker) decidedBy(x *expectRetry, instance string, proc int) bool {
	if x.input == nil || x.input.audit == nil {
		return false
	}
	inst, ok := c.instances[x.input.audit.rec.ProducerID]
	return ok && inst == instance && c.process(instance, x.decided) == proc
}

// joined reports whether a router process started, or the group may have
// rebalanced for another reason (Options.Rebalances), in (from -
// rebalanceSpan, to]: a partition that moved away from an instance and came
// back took its held retries with it (they come out at their moved times,
// like those of another process). A rebalance goes on after its cause (a
// member joins, is assigned, restores, and a member that cannot restore
// holds partitions until it leaves), hence the span before from.
func (c *checker) joined(from, to time.Time) bool {
	in := func(s time.Time) bool { return s.After(from.Add(-rebalanceSpan)) && !s.After(to) }
	for _, starts := range c.o.Starts {
		if slices.ContainsFunc(starts, in) {
			return true
		}
	}
	return slices.ContainsFunc(c.o.Rebalances, in)
}

// rebalanceSpan is how long after a process started (or another cause of
// a rebalance) the group's assignment may still be moving because of it.
const rebalanceSpan = 15 * time.Second

// breakerConfig is the policy's limits of ref's breaker: its scope's, or
// those of the override that sets them for its key.
func (c *checker) breakerConfig(ref breaker.Ref) breaker.Config {
	cfg, _ := c.o.Policy.BreakerLimits(ref)
	return cfg
}

// heldElsewhere reports whether another breaker of the retry x, on the same
// instance, was not CLOSED at some time between x's due time and until.
func heldElsewhere(timelines map[breakerKey][]span, k breakerKey, x *expectRetry, until time.Time) bool {
	for _, ref := range x.refs {
		if ref == k.ref {
			continue
		}
		for _, s := range timelines[breakerKey{k.instance, ref}] {
			if s.state != breaker.Closed.Name() && s.from.Before(until) && (s.to.IsZero() || s.to.After(x.notBefore)) {
				return true
			}
		}
	}
	return false
}

// resetWritten reports whether a RESET record of ref was written on the
// breakers topic (and not aborted) by at.
func (c *checker) resetWritten(ref breaker.Ref, at time.Time) bool {
	c.breakerTopic()
	return slices.ContainsFunc(c.resets[ref], func(r resetRec) bool { return !r.at.After(at) })
}

// itemSlack is how recent an item may be and still be unknown to the
// instance that releases its template: for an item of another instance,
// how long after the commit of its transaction: the delay of the breakers
// topic and that instance's next batch.
const itemSlack = 5 * time.Second

// released checks a transition e at at that took a template from OPEN to
// CLOSED on its instance: a reviewer's decision of the item of task decided
// (decided: the task it names; "" for a RESET, the last item another
// instance decided, or a template that was not latched there). No other
// item may hold the template then, by
// the breakers topic's order: every item the instance knew of by then (its
// own from its writing, another instance's from itemSlack after its
// commit) was ended by then, by its tombstone or a RESET written after it
// (breaker.latch_items). A RESET written before an item does not end it.
func (c *checker) released(ref breaker.Ref, e event.BreakerEvent, at time.Time, decided string) {
	if c.logs.Breakers == nil || !c.sharesLatches(e.Instance, at) {
		return
	}
	for _, h := range c.latchHolds()[ref.Key] {
		if h.task == decided || !h.checked || !h.from.Before(at.Add(-itemSlack)) || !h.to.IsZero() && !h.to.After(at) {
			continue
		}
		// another instance's item is known here once its transaction
		// committed, which a broker's restart may hold up
		if h.by != e.Instance && !h.committed.Before(at.Add(-itemSlack)) {
			continue
		}
		why := "when task " + decided + "'s item was decided"
		if decided == "" {
			why = "(" + e.Reason + ")"
		}
		c.violate("breaker.latch_items", e.TaskID, "%s reopened on instance %s at %s %s, but the item of task %s (offset %d of the breakers topic, written by %s at %s, committed %s, %s) was still open: ended %s",
			ref, e.Instance, stamp(at), why, h.task, h.offset, h.by, stamp(h.from), stamp(h.committed), aboveWhat(h), endedWhen(h))
	}
}

// latchedOpen reports whether a TRANSITION latched its breaker open: its
// faultrouter.breaker.latched header says so. Reasons are prose for people
// and are never parsed; every release in the upgrade window writes the
// header.
func latchedOpen(t transition) bool {
	return t.e.To == breaker.Open.Name() && codec.ParseBreakerHeaders(t.rec.Headers).Latched
}

// alertKind is what an ALERT is about: its faultrouter.alert header ("" on a
// record without it, which matches no alert the model expects).
func alertKind(rec *kgo.Record, _ *event.BreakerEvent) string {
	return codec.ParseBreakerHeaders(rec.Headers).Alert
}
