package checker

import (
	"slices"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Time in the model: a task's state lives 2 x SLA (the task's sla_ms, else
// the policy's default_sla_ms) after the last time the router touched it (a
// decision of one of its inputs, or the publication of its pending retry),
// on the router's clock, which the model reads from the audit and retry
// records. It never expires while a review item is open (the item lives
// until a person decides it), while a WRITE operation's outcome is unknown
// (until a receipt or a reviewer's decision of the OUTCOME_UNKNOWN item
// reconciles it), nor while a retry is pending. An input decided after its
// task expired is decided on a fresh state; the model forgets the task then
// too. With the state changelog (Logs.State), the model also checks the
// router's tombstones: none before the task expired, and one within
// Options.ExpiryLate after it, unless a new input started the task afresh.
// The model keeps its own account of reconciled writes rather than trusting
// the policy's: a reviewer's decision of an OUTCOME_UNKNOWN item resolves
// every write of the task that was unknown then.

// touch is the model's task state after one decision, as its expiry sees it.
type touch struct {
	at         time.Time
	slaMs      int64
	unresolved string // why the state cannot expire: an open review item, an unknown write; "" if it can
	pending    bool   // a retry (number pendN, decided at pendSince) is pending and was not published by at
	pendN      int32
	pendSince  time.Time
	pendDue    time.Time // the pending retry's not_before
	fresh      bool      // the state was forgotten before this decision: a new life of the task
}

// expiry is when the state after touch k expires as seen at time x (the
// retry it waited for may have been published since, which re-stamps it),
// in ms; 0 and why when it cannot expire by x.
func (c *checker) expiry(id string, k touch, x time.Time) (int64, string) {
	if k.unresolved != "" {
		return 0, k.unresolved
	}
	from := k.at
	if k.pending {
		p, ok := c.lastPublished(id, k.pendN, k.pendSince, x)
		if c.replay {
			p, ok = c.replayPublished(id, k, x)
		}
		if !ok {
			return 0, "a retry is pending"
		}
		if p.After(from) {
			from = p
		}
	}
	return from.UnixMilli() + 2*k.slaMs, ""
}

// replayPublished is when a replay (Replay) takes the pending retry of
// touch k to be published, if before x: at the time the retry topic
// records for a retry of that number and due time (a breaker's hold
// included), else, for a retry the router never published (another
// policy's), at its due time, as the router publishes a retry no breaker
// holds; the input decided at x is then marked Estimated.
func (c *checker) replayPublished(id string, k touch, x time.Time) (time.Time, bool) {
	var last time.Time
	ok := false
	for _, p := range c.pubs[id] {
		if p.n == k.pendN && p.due.Equal(k.pendDue) && !p.at.Before(k.pendSince) && p.at.Before(x) {
			last, ok = p.at, true
		}
	}
	if ok {
		return last, true
	}
	due := k.pendDue
	if due.Before(k.pendSince) {
		due = k.pendSince
	}
	if !due.Before(x) {
		return time.Time{}, false
	}
	c.estimated = true
	return due, true
}

// lastPublished is the latest publication of retry n of task id in
// [since, until). (A retry superseded in the millisecond of the decision
// that superseded it may be published in that millisecond too: the number
// tells them apart.)
func (c *checker) lastPublished(id string, n int32, since, until time.Time) (time.Time, bool) {
	var last time.Time
	ok := false
	for _, p := range c.pubs[id] {
		if p.n == n && !p.at.Before(since) && p.at.Before(until) {
			last, ok = p.at, true
		}
	}
	return last, ok
}

// published is one retry record: its number and time.
type published struct {
	n   int32
	at  time.Time
	due time.Time // its not_before
}

// indexPublished reads the publication time of every retry, by task, for
// the model's clock (checkRetries checks the records themselves).
func (c *checker) indexPublished() {
	c.pubs = map[string][]published{}
	for _, rec := range c.logs.Retry {
		r, err := c.codec.DecodeRouted(rec.Value)
		if err != nil || r.Decision.Retry == nil {
			continue
		}
		id := string(rec.Key)
		if r.Event != nil {
			id = r.Event.TaskID
		}
		c.pubs[id] = append(c.pubs[id], published{r.Decision.Retry.N, r.Decision.DecidedAt.Time, r.Decision.Retry.NotBefore.Time})
	}
	// a retry given up (held behind breakers past its task's lifetime) ends
	// as a publication does: the task's lifetime counts from then
	for _, rec := range c.logs.DeadLetter {
		r, err := c.codec.DecodeRouted(rec.Value)
		if err != nil || r.Decision.Rule != policy.RuleRetryHeldExpired || r.Decision.Retry == nil {
			continue
		}
		id := string(rec.Key)
		if r.Event != nil {
			id = r.Event.TaskID
		}
		c.pubs[id] = append(c.pubs[id], published{r.Decision.Retry.N, r.Decision.DecidedAt.Time, r.Decision.Retry.NotBefore.Time})
	}
	for _, ps := range c.pubs {
		slices.SortFunc(ps, func(a, b published) int { return a.at.Compare(b.at) })
	}
}

// unresolved says why the state st cannot expire, "" if it can: an open
// review item, or a WRITE operation SUBMITTED or UNKNOWN that no reviewer
// reconciled since (reconciled: op ID -> when, kept by the model).
func unresolved(st *task.State, reconciled map[string]time.Time) string {
	if st.Review == task.ReviewOpen {
		return "a review item is open"
	}
	for _, op := range st.Operations {
		if op.Kind == event.OpWrite && (op.State == event.OpSubmitted || op.State == event.OpUnknown) {
			if _, ok := reconciled[op.OpID]; !ok {
				return "write " + op.OpID + " has an unknown outcome"
			}
		}
	}
	return ""
}

// reconcile keeps the model's account of the task's writes whose outcome is
// unknown, around decision want of input in (st is the state after it;
// unknown the writes unknown before it): a reviewer's decision of an
// OUTCOME_UNKNOWN item reconciles them, and the state the policy leaves must
// say so; a task event held again as OUTCOME_UNKNOWN opens them again.
func (c *checker) reconcile(id string, in *input, want *event.Decision, st *task.State, at time.Time, unknown []string, reconciled map[string]time.Time) {
	switch {
	case in.kind == inReview && want.Class == event.ClassOutcomeUnknown && want.Route != event.RouteDrop:
		for _, op := range unknown {
			reconciled[op] = at
			c.rep.Reconciled++
		}
		for _, op := range st.Operations {
			if slices.Contains(unknown, op.OpID) && (op.State == event.OpSubmitted || op.State == event.OpUnknown) {
				c.violate("unknown.unreconciled", id, "input %s: a reviewer decided the OUTCOME_UNKNOWN item (%s), but write %s stays %s: the task would never expire",
					in.key, want.Route, op.OpID, op.State)
			}
		}
	case in.kind == inTask && want.Class == event.ClassOutcomeUnknown && want.Route != event.RouteDrop:
		for _, op := range unknownWrites(st) {
			delete(reconciled, op)
		}
	}
}

// unknownWrites are the IDs of the state's WRITE operations SUBMITTED or
// UNKNOWN.
func unknownWrites(st *task.State) []string {
	var ids []string
	for _, op := range st.Operations {
		if op.Kind == event.OpWrite && (op.State == event.OpSubmitted || op.State == event.OpUnknown) {
			ids = append(ids, op.OpID)
		}
	}
	return ids
}

// slaOf is the SLA the state's expiry counts with.
func (c *checker) slaOf(st *task.State) int64 {
	if st.SLAMs > 0 {
		return st.SLAMs
	}
	return c.o.Policy.DefaultSLAMs
}

// checkTombstones checks the state changelog's tombstones against the
// model's expiry of each task: none while the task could not expire, and
// one for every task whose state expired more than Options.ExpiryLate
// before the logs were read and that no input started afresh.
func (c *checker) checkTombstones() {
	if c.logs.State == nil {
		return
	}
	tombs := map[string][]time.Time{}
	for _, rec := range c.logs.State {
		if rec.Value != nil {
			continue
		}
		c.rep.Tombstones++
		id := string(rec.Key)
		tombs[id] = append(tombs[id], rec.Timestamp)
		tr := c.tasks[id]
		if tr == nil || tr.stopped {
			continue
		}
		// the last decision before the tombstone; one in the same
		// millisecond may be of the batch after it
		var cands []touch
		for i := len(tr.touches) - 1; i >= 0 && len(cands) < 2; i-- {
			if !tr.touches[i].at.After(rec.Timestamp) {
				cands = append(cands, tr.touches[i])
			}
		}
		if len(cands) == 0 {
			c.violate("state.tombstone_early", id, "tombstone %d@%d at %s, before the task's first decision", rec.Partition, rec.Offset, stamp(rec.Timestamp))
			continue
		}
		ok, why := false, ""
		for _, k := range cands {
			e, w := c.expiry(id, k, rec.Timestamp)
			if w == "" && e <= rec.Timestamp.UnixMilli() {
				ok = true
				break
			}
			if why == "" {
				why = w
				if w == "" {
					why = "it expires at " + stamp(time.UnixMilli(e))
				}
			}
		}
		if !ok {
			c.violate("state.expired_early", id, "tombstone %d@%d at %s forgets the task, but %s (its last decision at %s)",
				rec.Partition, rec.Offset, stamp(rec.Timestamp), why, stamp(cands[0].at))
		}
	}
	if c.logs.End.IsZero() {
		return
	}
	for id, tr := range c.tasks {
		if tr.stopped || len(tr.touches) == 0 {
			continue
		}
		k := tr.touches[len(tr.touches)-1]
		e, why := c.expiry(id, k, c.logs.End)
		if why != "" || c.logs.End.Sub(time.UnixMilli(e)) <= c.o.ExpiryLate {
			continue
		}
		c.rep.Expired++
		if !slices.ContainsFunc(tombs[id], func(x time.Time) bool { return !x.Before(k.at) }) {
			c.violate("state.never_expired", id, "the task's state expired at %s (2 x SLA %dms after %s) and the logs were read at %s, but the changelog has no tombstone for it",
				stamp(time.UnixMilli(e)), 2*k.slaMs, stamp(k.at), stamp(c.logs.End))
		}
	}
}

// retryLateness checks how late a published retry came out: within
// Options.RetryLate of the moment it could be published, its due time or,
// when a breaker it is published into was not closed then (on any
// instance), the end of that breaker's last such stretch before it came out.
func (c *checker) retryLateness(x *expectRetry, p *routed, timelines map[breakerKey][]span) {
	ready := x.notBefore
	if x.decided.After(ready) {
		ready = x.decided
	}
	at := p.at()
	for k, tl := range timelines {
		if !slices.Contains(x.refs, k.ref) {
			continue
		}
		for _, s := range tl {
			if s.state == breaker.Closed.Name() || !s.from.Before(at) || !s.to.IsZero() && s.to.Before(ready) {
				continue
			}
			end := s.to
			if end.IsZero() || end.After(at) {
				end = at
			}
			if end.After(ready) {
				ready = end
			}
		}
	}
	late := at.Sub(ready)
	if ms := late.Milliseconds(); ms > c.rep.MaxRetryLateMs {
		c.rep.MaxRetryLateMs = ms
	}
	if late > c.o.RetryLate {
		c.violate("retry.late", x.task, "retry n=%d (due %s, publishable from %s) published at %s, %s late; bound %s",
			x.n, stamp(x.notBefore), stamp(ready), stamp(at), late.Round(time.Millisecond), c.o.RetryLate)
	}
}
