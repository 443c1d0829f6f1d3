package checker

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// A latch holds everywhere (breaker.latch_everywhere). A hallucination
// routed on one instance latches its prompt template there; the latch
// reaches the other instances through the breakers topic (and the LATCH
// command on every decisions partition) once the batch's transaction
// commits. So, whichever instance routes it, no retry into the template is
// published later than latchReach after the hallucination was decided, until
// the template is free again: every hallucination item of it opened since is
// decided (or its task re-driven), or a reset (by hand, or the one a
// reviewer's decision of the last item writes) was applied on some instance.
// The per-instance checks (breakers.go) see only what each instance's own
// transitions say; this one reads the latch from the model's items, so it
// also catches an instance that never heard of the latch.

// latchReach bounds how long after a hallucination's decision every instance
// holds its template: the batch's commit (the router's --max-batch-latency,
// 500 ms by default), the breakers topic's delivery to the other instances,
// and their next batch (--tick, 200 ms), with room for a loaded machine.
const latchReach = 5 * time.Second

// LatchReach is what the latch_everywhere check saw.
type LatchReach struct {
	// Stretches counts the stretches of time a prompt template was latched:
	// from a hallucination's decision until the template was free again.
	Stretches int
	// HeldElsewhere counts the retries of a latched template that came due
	// inside a stretch, past latchReach, and were decided on another
	// instance than the one whose hallucination latched it: the retries only
	// the shared latch holds.
	HeldElsewhere int
	// MaxAdoptMs is the latest, in ms after a stretch began, that another
	// running instance took the latch (a latched OPEN of its own, adopted
	// or from the LATCH command); instances that started or were stopped
	// meanwhile are left out.
	MaxAdoptMs int64
}

func (l LatchReach) String() string {
	return fmt.Sprintf("%d stretches of a latched template, %d retries of one due on another instance than the latch's (held by the shared latch), latest adoption %d ms after the latch",
		l.Stretches, l.HeldElsewhere, l.MaxAdoptMs)
}

// stretch is a time a prompt template was latched: [from, to), to zero
// while it lasts; by is the instance whose hallucination began it.
type stretch struct {
	from, to time.Time
	by       string
	task     string
}

// latchEverywhere checks every retry published into a prompt template
// against the stretches the template was latched, on any instance.
func (c *checker) latchEverywhere() {
	stretches := c.latchStretches()
	latched := c.latchTransitions()
	routed := c.decisionTimes()
	for tpl, ss := range stretches {
		c.rep.Latch.Stretches += len(ss)
		for _, s := range ss {
			c.latchAdoption(latched[tpl], routed, s)
		}
	}
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, ref := range x.refs {
				if ref.Scope != breaker.PromptTemplate {
					continue
				}
				for _, s := range stretches[ref.Key] {
					c.retryInLatch(x, ref, s)
				}
			}
		}
	}
}

// retryInLatch checks the publications of retry x into template ref against
// one stretch s of its latch, and counts x when only the shared latch held it.
func (c *checker) retryInLatch(x *expectRetry, ref breaker.Ref, s stretch) {
	held := s.from.Add(latchReach)
	for _, p := range x.published {
		at := p.at()
		if at.After(held) && (s.to.IsZero() || at.Before(s.to)) {
			c.violate("breaker.latch_everywhere", x.task, "retry n=%d published at %s on instance %s into %s, latched since %s on instance %s by task %s's hallucination (bound %s)",
				x.n, stamp(at), c.instanceOf(p.rec.ProducerID), ref, stamp(s.from), s.by, s.task, latchReach)
		}
	}
	due := x.notBefore
	if x.decided.After(due) {
		due = x.decided
	}
	if x.input == nil || x.input.audit == nil || !due.After(held) || !s.to.IsZero() && !due.Before(s.to) ||
		x.superseded != nil && !x.superseded.After(due) {
		return
	}
	if by := c.instanceOf(x.input.audit.rec.ProducerID); by != s.by {
		c.rep.Latch.HeldElsewhere++
	}
}

// instanceOf names the instance of a producer ID, as its alerts do.
func (c *checker) instanceOf(producer int64) string {
	if inst, ok := c.instances[producer]; ok {
		return inst
	}
	return fmt.Sprintf("(producer %d)", producer)
}

// latchStretches are, per prompt template, the stretches it was latched, in
// time order: the union of its hallucination items' open times, each cut
// short by the first reset applied after it opened.
func (c *checker) latchStretches() map[string][]stretch {
	resets := map[string][]time.Time{} // when a RESET of a template was applied, per template
	for _, in := range c.inputs {
		if in.kind != inCommand || in.audit == nil || in.command.Kind != event.BreakerKindReset {
			continue
		}
		if ref, invalid := policy.BreakerCommand(&in.command, in.audit.at()); invalid == nil && ref.Scope == breaker.PromptTemplate {
			resets[ref.Key] = append(resets[ref.Key], in.audit.at())
		}
	}
	out := map[string][]stretch{}
	for tpl, items := range c.latchItems {
		rs := resets[tpl]
		slices.SortFunc(rs, time.Time.Compare)
		var ss []stretch
		for _, it := range items {
			s := stretch{from: it.opened, to: it.decided, by: c.latchedBy(it), task: it.task}
			if i, _ := slices.BinarySearchFunc(rs, it.opened, time.Time.Compare); i < len(rs) && (s.to.IsZero() || rs[i].Before(s.to)) {
				s.to = rs[i]
			}
			if !s.to.IsZero() && !s.to.After(s.from) {
				continue
			}
			ss = append(ss, s)
		}
		slices.SortFunc(ss, func(a, b stretch) int { return a.from.Compare(b.from) })
		var merged []stretch
		for _, s := range ss {
			// an item opened in the millisecond the last one was decided is
			// a new stretch: one batch may reopen the template and latch it
			// again, with retries released in between
			if n := len(merged); n > 0 && (merged[n-1].to.IsZero() || s.from.Before(merged[n-1].to)) {
				if last := &merged[n-1]; !last.to.IsZero() && (s.to.IsZero() || s.to.After(last.to)) {
					last.to = s.to
				}
				continue
			}
			merged = append(merged, s)
		}
		if len(merged) > 0 {
			out[tpl] = merged
		}
	}
	return out
}

// latchedBy is the instance that routed the hallucination of a latch item.
func (c *checker) latchedBy(it latchItem) string {
	if tr := c.tasks[it.task]; tr != nil {
		for _, in := range tr.inputs {
			if in.kind == inTask && in.audit != nil && in.audit.at().Equal(it.opened) {
				return c.instanceOf(in.audit.rec.ProducerID)
			}
		}
	}
	return "(unknown)"
}

// latchAdoption measures how soon each other instance that went on routing
// through stretch s took the latch: its first latched OPEN transition of
// the template in s (latched: those transitions, in time order; routed: the
// decision times of each instance, decisionTimes).
func (c *checker) latchAdoption(latched []transition, routed map[string][]time.Time, s stretch) {
	first := map[string]time.Time{}
	for _, t := range latched {
		if t.e.Instance == s.by || t.e.At.Before(s.from) || !s.to.IsZero() && !t.e.At.Before(s.to) {
			continue
		}
		if _, ok := first[t.e.Instance]; !ok {
			first[t.e.Instance] = t.e.At.Time
		}
	}
	for inst, at := range first {
		// a process that started meanwhile read the latch when it started;
		// one that decided nothing in between was stopped (or paused) and
		// takes the latch in its first batch when it goes on
		if c.process(inst, s.from) != c.process(inst, at) {
			continue
		}
		ts := routed[inst]
		i, _ := slices.BinarySearchFunc(ts, s.from, time.Time.Compare)
		for i < len(ts) && !ts[i].After(s.from) {
			i++
		}
		if i == len(ts) || !ts[i].Before(at) {
			continue
		}
		if ms := at.Sub(s.from).Milliseconds(); ms > c.rep.Latch.MaxAdoptMs {
			c.rep.Latch.MaxAdoptMs = ms
		}
	}
}

// decisionTimes are the times of the audited decisions of each instance,
// in order.
func (c *checker) decisionTimes() map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, in := range c.inputs {
		if in.audit != nil {
			inst := c.instanceOf(in.audit.rec.ProducerID)
			out[inst] = append(out[inst], in.audit.at())
		}
	}
	for _, ts := range out {
		slices.SortFunc(ts, time.Time.Compare)
	}
	return out
}

// latchTransitions are, per prompt template, the TRANSITIONs of the alerts
// topic that latched it open, on any instance, in time order.
func (c *checker) latchTransitions() map[string][]transition {
	out := map[string][]transition{}
	for _, rec := range c.logs.Alerts {
		e, err := c.codec.DecodeBreakerEvent(rec.Value)
		if err != nil || e.Kind != "TRANSITION" || e.Scope != breaker.PromptTemplate.String() {
			continue
		}
		if t := (transition{rec, e}); latchedOpen(t) {
			out[e.Key] = append(out[e.Key], t)
		}
	}
	for _, ts := range out {
		slices.SortFunc(ts, func(a, b transition) int { return cmp.Compare(a.e.At.UnixMilli(), b.e.At.UnixMilli()) })
	}
	return out
}
