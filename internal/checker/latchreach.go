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
// routed on one instance latches its prompt template there, and opens a
// latch item; both reach the other instances through the breakers topic
// (and the LATCH command on every decisions partition) once the batch's
// transaction commits. So, whichever instance routes it, no retry into the
// template is published later than latchReach after that commit, until the
// item is decided (or its task re-driven) or a reset (by hand, or the one a
// reviewer's decision of the last open item writes) was applied on some
// instance. The commit is not in the logs; the instance's next batch is
// (its next decision or retry publication), and a batch begins only after
// the one before committed: that is the commit's time, at the latest. The
// per-instance checks (breakers.go) see what each instance's own
// transitions say; this one reads the latch from the model's items, so it
// also catches an instance that never heard of the latch.

// latchReach bounds how long after the commit of a hallucination's batch
// every instance holds its template: the breakers topic's delivery to the
// other instances and their next batch (--tick, 200 ms by default), with
// room for a loaded machine.
const latchReach = 5 * time.Second

// LatchReach is what the latch_everywhere check saw.
type LatchReach struct {
	// Stretches counts the stretches of time a prompt template was latched:
	// from a hallucination's decision until the template was free again.
	Stretches int
	// HeldElsewhere counts the retries of a latched template that came due
	// while an item held it, past latchReach after its commit, and were
	// decided on another instance than the one that opened the item: the
	// retries only the shared latch holds.
	HeldElsewhere int
	// MaxAdoptMs is the latest, in ms after a stretch began, that another
	// instance took the latch (a latched OPEN of its own, adopted or from
	// the LATCH command), among those that kept running batches: its batch
	// before the one that took the latch ran at most a second earlier (not
	// a process that started, was paused or waited for the broker then).
	MaxAdoptMs int64
}

func (l LatchReach) String() string {
	return fmt.Sprintf("%d stretches of a latched template, %d retries of one due on another instance than the latch's (held by the shared latch), latest adoption %d ms after the latch",
		l.Stretches, l.HeldElsewhere, l.MaxAdoptMs)
}

// hold is one latch item's hold on its template: from the decision of its
// hallucination (from) on instance by, committed by then at the latest
// (zero: unknown), until it was decided or a reset applied (to, zero while
// it lasts).
type hold struct {
	task, by            string
	from, committed, to time.Time
}

// stretch is a time a prompt template was latched: [from, to), to zero
// while it lasts; by is the instance whose hallucination began it.
type stretch struct {
	from, to time.Time
	by       string
}

// latchEverywhere checks every retry published into a prompt template
// against the holds of the template's latch items, on any instance.
func (c *checker) latchEverywhere() {
	batches := c.batchTimes()
	holds := c.latchHolds()
	latched := c.latchTransitions()
	for tpl, hs := range holds {
		ss := stretches(hs)
		c.rep.Latch.Stretches += len(ss)
		for _, s := range ss {
			c.latchAdoption(latched[tpl], batches, s)
		}
	}
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, ref := range x.refs {
				if ref.Scope == breaker.PromptTemplate {
					c.retryInLatch(x, ref, holds[ref.Key])
				}
			}
		}
	}
}

// retryInLatch checks each publication of retry x into template ref against
// the holds of the template's latch (reporting it once), and counts x when
// it came due while a hold of another instance's item held it.
func (c *checker) retryInLatch(x *expectRetry, ref breaker.Ref, holds []hold) {
	// holding reports whether h held the template everywhere at t
	holding := func(h hold, t time.Time) bool {
		return !h.committed.IsZero() && t.After(h.committed.Add(latchReach)) && (h.to.IsZero() || t.Before(h.to))
	}
	for _, p := range x.published {
		at, inst := p.at(), c.instanceOf(p.rec.ProducerID)
		if !c.sharesLatches(inst, at) {
			continue
		}
		if i := slices.IndexFunc(holds, func(h hold) bool { return holding(h, at) }); i >= 0 {
			h := holds[i]
			c.violate("breaker.latch_everywhere", x.task, "retry n=%d published at %s on instance %s into %s, latched since %s on instance %s by task %s's hallucination (committed by %s; bound %s)",
				x.n, stamp(at), inst, ref, stamp(h.from), h.by, h.task, stamp(h.committed), latchReach)
		}
	}
	due := x.notBefore
	if x.decided.After(due) {
		due = x.decided
	}
	if x.input == nil || x.input.audit == nil || x.superseded != nil && !x.superseded.After(due) {
		return
	}
	by := c.instanceOf(x.input.audit.rec.ProducerID)
	if slices.ContainsFunc(holds, func(h hold) bool { return h.by != by && holding(h, due) }) {
		c.rep.Latch.HeldElsewhere++
	}
}

// sharesLatches reports whether the process of instance that ran at t
// shares its latches (Options.SharesLatches).
func (c *checker) sharesLatches(instance string, t time.Time) bool {
	return c.o.SharesLatches == nil || c.o.SharesLatches(instance, t)
}

// instanceOf names the instance of a producer ID, as its alerts do.
func (c *checker) instanceOf(producer int64) string {
	if inst, ok := c.instances[producer]; ok {
		return inst
	}
	return fmt.Sprintf("(producer %d)", producer)
}

// latchHolds are, per prompt template, the holds of its latch items, each
// cut short by the first reset applied after it opened.
func (c *checker) latchHolds() map[string][]hold {
	resets := map[string][]time.Time{} // when a RESET of a template was applied, per template
	for _, in := range c.inputs {
		if in.kind != inCommand || in.audit == nil || in.command.Kind != event.BreakerKindReset {
			continue
		}
		if ref, invalid := policy.BreakerCommand(&in.command, in.audit.at()); invalid == nil && ref.Scope == breaker.PromptTemplate {
			resets[ref.Key] = append(resets[ref.Key], in.audit.at())
		}
	}
	out := map[string][]hold{}
	for tpl, items := range c.latchItems {
		rs := resets[tpl]
		slices.SortFunc(rs, time.Time.Compare)
		for _, it := range items {
			h := hold{task: it.task, by: c.latchedBy(it), from: it.opened, committed: c.committed(it), to: it.decided}
			if i, _ := slices.BinarySearchFunc(rs, it.opened, time.Time.Compare); i < len(rs) && (h.to.IsZero() || rs[i].Before(h.to)) {
				h.to = rs[i]
			}
			if !h.to.IsZero() && !h.to.After(h.from) || !c.sharesLatches(h.by, h.from) {
				continue
			}
			out[tpl] = append(out[tpl], h)
		}
		slices.SortFunc(out[tpl], func(a, b hold) int { return a.from.Compare(b.from) })
	}
	return out
}

// stretches are the times a template was latched: the union of its holds
// (in order of from). A hold that begins in the millisecond the one before
// ended begins a new stretch: one batch may reopen the template, release
// its held retries and latch it again.
func stretches(hs []hold) []stretch {
	var out []stretch
	for _, h := range hs {
		if n := len(out); n > 0 && (out[n-1].to.IsZero() || h.from.Before(out[n-1].to)) {
			if last := &out[n-1]; !last.to.IsZero() && (h.to.IsZero() || h.to.After(last.to)) {
				last.to = h.to
			}
			continue
		}
		out = append(out, stretch{from: h.from, to: h.to, by: h.by})
	}
	return out
}

// after is the index of the first time in ts (in order) after t.
func after(ts []time.Time, t time.Time) int {
	i, _ := slices.BinarySearchFunc(ts, t, time.Time.Compare)
	for i < len(ts) && !ts[i].After(t) {
		i++
	}
	return i
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

// latchAdoption measures how soon each other instance that went on
// deciding through stretch s took the latch: its first latched OPEN
// transition of the template in s (latched: those transitions, in time
// order; batches: each instance's batch times, batchTimes).
func (c *checker) latchAdoption(latched []transition, batches map[string][]time.Time, s stretch) {
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
		// one that was paused, or waited for the broker, takes it in its
		// first batch when it goes on
		if c.process(inst, s.from) != c.process(inst, at) {
			continue
		}
		ts := batches[inst]
		i, _ := slices.BinarySearchFunc(ts, at, time.Time.Compare) // ts[i-1]: its batch before
		if i == 0 || at.Sub(ts[i-1]) > time.Second {
			continue
		}
		if ms := at.Sub(s.from).Milliseconds(); ms > c.rep.Latch.MaxAdoptMs {
			c.rep.Latch.MaxAdoptMs = ms
		}
	}
}

// committed is when the batch that opened latch item it had committed, at
// the latest: the next batch its instance ran. Zero when there is none in
// the logs.
func (c *checker) committed(it latchItem) time.Time {
	ts := c.batchTimes()[c.latchedBy(it)]
	if i := after(ts, it.opened); i < len(ts) {
		return ts[i]
	}
	return time.Time{}
}

// batchTimes are, per instance, the times its batches ran, in order: the
// times of its audited decisions and of its retry publications.
func (c *checker) batchTimes() map[string][]time.Time {
	if c.batches != nil {
		return c.batches
	}
	out := map[string][]time.Time{}
	add := func(r *routed) {
		inst := c.instanceOf(r.rec.ProducerID)
		out[inst] = append(out[inst], r.at())
	}
	for _, in := range c.inputs {
		if in.audit != nil {
			add(in.audit)
		}
	}
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, p := range x.published {
				add(p)
			}
		}
	}
	for inst, ts := range out {
		slices.SortFunc(ts, time.Time.Compare)
		out[inst] = slices.CompactFunc(ts, time.Time.Equal)
	}
	c.batches = out
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
