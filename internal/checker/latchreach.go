package checker

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// A latch holds everywhere (breaker.latch_everywhere), in the order of the
// breakers topic (breakerlog.go). A hallucination routed on one instance
// writes its template's latch item there in its batch's transaction; once
// that commits, every instance reads it in the topic's order. So, whichever
// instance routes it, no retry into the template is published later than
// latchReach after that commit, until a later record ends the item: its
// tombstone (a reviewer decided it, or its task was re-driven) or a RESET
// of the template written after it. A RESET written before the item (a
// lower offset) does not end it, however late an instance reads either.
// The per-instance checks (breakers.go, here) see what each instance's own
// transitions say; this one reads the latch from the breakers topic, so it
// also catches an instance that never heard of the latch, or that let a
// RESET end an item written after it.
//
// Every hallucination of a template the policy latches must have written
// its item (breaker.item_record): the check would otherwise have nothing
// to hold retries with.

// latchReach bounds how long after the commit of an item's transaction
// every instance holds its template: a batch publishes retries only with a
// breakers table that had read to a listing of the topic's offsets taken
// at most 2 s before, so the item reaches every batch that begins 2 s
// after its commit (and the commit's markers), with room for a loaded
// machine.
const latchReach = 5 * time.Second

// LatchReach is what the latch_everywhere check saw.
type LatchReach struct {
	// Records counts the records of the breakers topic read (control
	// records included); Unread the offsets below the last of them that
	// were never read (the log cleaner removed them first). Items and
	// Resets count the committed item records of prompt templates and the
	// committed RESET records.
	Records       int
	Unread        int64
	Items, Resets int
	// AboveReset counts the item records written after a RESET of their
	// template (a higher offset): a RESET read after them must not end
	// them. EndedByReset counts the items a RESET written after them ended.
	// Unchecked counts the items whose end lies beyond unread offsets.
	AboveReset, EndedByReset, Unchecked int
	// Stretches counts the stretches of time a prompt template was latched:
	// from a hallucination's decision until the template was free again.
	Stretches int
	// HeldElsewhere counts the retries of a latched template that came due
	// while an item held it, past latchReach after its commit, and were
	// decided on another instance than the one that opened the item: the
	// retries only the shared latch holds.
	HeldElsewhere int
	// MaxAdoptMs is the latest, in ms after a stretch began, that another
	// instance took the latch (a latched OPEN of its own, adopted from the
	// item), among those that kept running batches: its batch before the
	// one that took the latch ran at most a second earlier (not a process
	// that started, was paused or waited for the broker then).
	MaxAdoptMs int64
}

func (l LatchReach) String() string {
	if l.Records == 0 {
		return "no breakers topic read: latches not checked"
	}
	return fmt.Sprintf("breakers topic: %d records read (%d offsets unread), %d items, %d RESETs, %d items written after a RESET of their template, %d ended by a RESET, %d unchecked; "+
		"%d stretches of a latched template, %d retries of one due on another instance than the latch's (held by the shared latch), latest adoption %d ms after the latch",
		l.Records, l.Unread, l.Items, l.Resets, l.AboveReset, l.EndedByReset, l.Unchecked, l.Stretches, l.HeldElsewhere, l.MaxAdoptMs)
}

// stretch is a time a prompt template was latched: [from, to), to zero
// while it lasts; by is the instance whose hallucination began it.
type stretch struct {
	from, to time.Time
	by       string
}

// latchEverywhere checks every retry published into a prompt template
// against the holds of the template's latch items, on any instance, and
// that every hallucination that latches wrote its item. Without a
// breakers topic (Logs.Breakers nil) it checks nothing.
func (c *checker) latchEverywhere() {
	if c.logs.Breakers == nil {
		return
	}
	holds := c.latchHolds()
	batches := c.batchTimes()
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
	c.itemRecords()
	c.openEverywhere() // openreach.go
}

// retryInLatch checks each publication of retry x into template ref against
// the holds of the template's latch items (reporting it once), and counts
// x when it came due while a hold of another instance's item held it.
func (c *checker) retryInLatch(x *expectRetry, ref breaker.Ref, holds []hold) {
	for _, p := range x.published {
		at, inst := p.at(), c.instanceOf(p.rec.ProducerID)
		if !c.sharesLatches(inst, at) {
			continue
		}
		if i := slices.IndexFunc(holds, func(h hold) bool { return h.holding(at) }); i >= 0 {
			h := holds[i]
			c.violate("breaker.latch_everywhere", x.task, "retry n=%d published at %s on instance %s into %s, latched by task %s's item "+
				"(offset %d of the breakers topic, written by %s at %s, committed %s, %s; ended %s); bound %s",
				x.n, stamp(at), inst, ref, h.task, h.offset, h.by, stamp(h.from), stamp(h.committed), aboveWhat(h), endedWhen(h), latchReach)
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
	if slices.ContainsFunc(holds, func(h hold) bool { return h.by != by && h.holding(due) }) {
		c.rep.Latch.HeldElsewhere++
	}
}

// aboveWhat says where a hold's item lies against its template's RESETs.
func aboveWhat(h hold) string {
	if h.aboveReset < 0 {
		return "no RESET of the template before it"
	}
	return fmt.Sprintf("above the template's RESET at offset %d", h.aboveReset)
}

// endedWhen says what ended a hold, and when.
func endedWhen(h hold) string {
	if h.to.IsZero() {
		return "never"
	}
	return fmt.Sprintf("at %s by %s", stamp(h.to), h.endedBy)
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

// latchHolds are, per prompt template, the holds of its latch items read
// from the breakers topic (breakerlog.go), in order of their items' times.
func (c *checker) latchHolds() map[string][]hold {
	c.breakerTopic()
	return c.holds
}

// itemRecords checks that every hallucination that latches its template
// (policy.LatchesTemplate) wrote its item on the breakers topic, an item
// record of its task and template opened at the decision's time, and that
// every reviewer's decision of such an item wrote its tombstone then
// (breaker.item_record): each in the transaction of the decision's batch,
// so a committed decision has its record. Decisions of processes that do
// not share their latches are left out, and nothing is checked when
// offsets of the topic were never read.
func (c *checker) itemRecords() {
	if c.rep.Latch.Unread > 0 {
		return
	}
	for _, d := range c.latchDecisions {
		inst := c.instanceOf(d.producer)
		if !c.sharesLatches(inst, d.at) {
			continue
		}
		key := event.BreakerItemKey(breaker.PromptTemplate.Name(), d.template, d.task)
		if c.itemSeen[itemSeen{key, d.at.UnixMilli(), d.open}] {
			continue
		}
		if d.open {
			c.violate("breaker.item_record", d.task, "the hallucination of task %s decided at %s on instance %s latches template %s, but the breakers topic has no item record %q opened then",
				d.task, stamp(d.at), inst, d.template, key)
		} else {
			c.violate("breaker.item_record", d.task, "a reviewer's decision of task %s's hallucination item (template %s) was decided at %s on instance %s, but the breakers topic has no tombstone of %q written then",
				d.task, d.template, stamp(d.at), inst, key)
		}
	}
}

// latchDecision is a hallucination decision that latches its template
// (open), or a reviewer's decision of its item: each writes an item record
// on the breakers topic.
type latchDecision struct {
	task, template string
	at             time.Time
	producer       int64
	open           bool
}

// itemSeen is an item record of the breakers topic not aborted: its key,
// when it was written (an open record's opened_at, a tombstone's
// timestamp, in ms) and whether it opens the item.
type itemSeen struct {
	key  string
	ms   int64
	open bool
}

// stretches are the times a template was latched: the union of its holds
// (in order of from). A hold that begins in the millisecond the one before
// ended begins a new stretch: one batch may reopen the template, release
// its held retries and latch it again.
func stretches(hs []hold) []stretch {
	var out []stretch
	for _, h := range hs {
		if !h.to.IsZero() && !h.to.After(h.from) {
			continue // ended in the batch that opened it
		}
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
		if err != nil || e.Kind != "TRANSITION" || e.Scope != breaker.PromptTemplate.Name() {
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
