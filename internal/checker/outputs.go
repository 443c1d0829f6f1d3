package checker

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// retryKey names one retry of a task: its retry number.
type retryKey struct {
	task string
	n    int32
}

// expectRetry is a RETRY decision and what became of it.
type expectRetry struct {
	task       string
	n          int32
	eventID    string // the event the retry re-issues
	class      event.Class
	refs       []breaker.Ref
	notBefore  time.Time
	decided    time.Time
	superseded *time.Time // the later decision that replaced it, if any
	input      *input
	partition  int32
	published  []*routed
	// gaveUp are the dead letters that ended it unpublished: held behind
	// breakers until its task's lifetime ended (rule retry.held_expired)
	gaveUp []*routed
	slaMs  int64 // its task's SLA when decided
}

// ends are what ended the retry: its publications and give-ups.
func (x *expectRetry) ends() []*routed { return append(slices.Clone(x.published), x.gaveUp...) }

// decisionKey is a task's decision at one time (ms).
type decisionKey struct {
	task string
	at   int64
}

// alertKey is an immediate alert: scope, key, task, time (ms).
type alertKey struct {
	scope     event.BreakerScope
	key, task string
	at        int64
}

// reviewItem is an open review item and its owner's SLA clock.
type reviewItem struct {
	task    string
	class   event.Class // its class when opened
	classes []classAt   // the later decisions that kept it open with another class
	opened  time.Time
	due     time.Time
	closed  *time.Time
	alerted []event.BreakerEvent
}

// classAt is a review item's class from a time on.
type classAt struct {
	at    time.Time
	class event.Class
}

// classAt is the item's class at t: its alert names the task's class then.
func (it *reviewItem) classAt(t time.Time) event.Class {
	c := it.class
	for _, x := range it.classes {
		if !x.at.After(t) {
			c = x.class
		}
	}
	return c
}

// checkRouted checks the review and dead-letter topics: exactly the records
// the model expects, each once, with the audited decision.
func (c *checker) checkRouted() {
	for _, short := range []topicspec.Short{topicspec.Review, topicspec.DeadLetter} {
		want := c.reviews
		recs := c.logs.Review
		if short == topicspec.DeadLetter {
			want, recs = c.dead, c.logs.DeadLetter
		}
		seen := map[inputKey]bool{}
		for _, rec := range recs {
			var k inputKey
			var out Output
			var got *routed
			var ei codec.ErrorInfo
			if e := codec.ParseHeaders(rec.Headers).Error; e != nil {
				ei = *e
			}
			if short == topicspec.DeadLetter && (ei.Stage == codec.StageDecode || ei.Stage == codec.StageValidate) {
				k = inputKey{ei.Topic, ei.Partition, ei.Offset}
				out = Output{Topic: short, Input: k.String(), Class: string(event.ClassInvalidInput), Route: "DEADLETTER",
					Rule: policy.InputRule(ei.Kind), At: stamp(rec.Timestamp)}
			} else {
				r, ok := c.routed(short, rec)
				if !ok {
					continue
				}
				got = r
				k = inputKey{r.r.Input.Topic, r.r.Input.Partition, r.r.Input.Offset}
				out = outputOf(short, r, "")
			}
			if short == topicspec.Review {
				c.rep.Reviews++
			} else {
				c.rep.DeadLetters++
			}
			if short == topicspec.DeadLetter && got != nil && got.r.Decision.Rule == policy.RuleRetryHeldExpired {
				c.heldExpired(rec, got) // a held retry given up: it ends a RETRY decision, not an input
				continue
			}
			in := want[k]
			task := string(rec.Key)
			if in != nil {
				task = in.task
			}
			c.actual(task, out)
			switch {
			case in == nil:
				c.violate(string(short)+".extra", task, "%s %d@%d for input %s, which the model routes nowhere near %s",
					short, rec.Partition, rec.Offset, k, short)
			case seen[k]:
				c.violate(string(short)+".duplicate", task, "%s: input %s routed twice (again at %d@%d)", short, k, rec.Partition, rec.Offset)
			case in.kind == inUnwritable:
				c.checkUnwritableCopy(in, rec, got, ei) // unwritable.go
			case in.kind == inPoison:
				if got != nil || ei.Kind != in.errKind || string(rec.Value) != string(in.rec.Value) {
					c.violate(string(short)+".poison", task, "%s %d@%d for poison input %s: kind %q, want %q, original bytes kept: %v",
						short, rec.Partition, rec.Offset, k, ei.Kind, in.errKind, string(rec.Value) == string(in.rec.Value))
				}
			case got == nil:
				c.violate(string(short)+".decision", task, "%s %d@%d for input %s is a raw dead letter, want the routed event", short, rec.Partition, rec.Offset, k)
			default:
				if d := diffDecision(got.r.Decision, in.decided); d != "" {
					c.violate(string(short)+".decision", task, "%s record for input %s: %s", short, k, d)
				}
				if got.r.Event == nil || got.r.Event.EventID != in.event.EventID {
					c.violate(string(short)+".event", task, "%s record for input %s does not carry event %s", short, k, in.event.EventID)
				}
			}
			seen[k] = true
		}
		for k, in := range want {
			if !seen[k] {
				c.violate(string(short)+".missing", in.task, "input %s was decided %s/%s (%s): no record on %s",
					k, in.decided.Class, in.decided.Route, in.decided.Rule, short)
			}
		}
	}
}

// checkRetries checks the retry topic: every retry the model expects
// published exactly once, at or after its due time, re-issuing the right
// event; a superseded retry at most once and before the decision that
// superseded it; nothing else.
func (c *checker) checkRetries() {
	for _, rec := range c.logs.Retry {
		c.rep.Retries++
		r, ok := c.routed(topicspec.Retry, rec)
		if !ok {
			continue
		}
		task := taskOf(r)
		c.actual(task, outputOf(topicspec.Retry, r, ""))
		if r.r.Decision.Retry == nil {
			c.violate("retry.plan", task, "retry %d@%d carries no retry plan", rec.Partition, rec.Offset)
			continue
		}
		x := c.matchRetry(task, r)
		if x == nil {
			c.violate("retry.extra", task, "retry %d@%d (n=%d) matches no RETRY decision of the task", rec.Partition, rec.Offset, r.r.Decision.Retry.N)
			continue
		}
		x.published = append(x.published, r)
	}
	for _, xs := range c.retries {
		for _, x := range xs {
			c.checkRetry(x)
		}
	}
}

// matchRetry finds the RETRY decision a published (or given-up) retry
// answers: same task, retry number and event; of several (a re-drive or a
// new lifetime restarts the numbers), the first still unpublished and not
// given up whose window (due time to superseding decision)
// holds the publication, else the last.
func (c *checker) matchRetry(task string, r *routed) *expectRetry {
	xs := c.retries[retryKey{task, r.r.Decision.Retry.N}]
	if len(xs) <= 1 {
		if len(xs) == 1 {
			return xs[0]
		}
		return nil
	}
	at := r.at()
	fits := func(x *expectRetry) bool {
		return len(x.published) == 0 && len(x.gaveUp) == 0 && (r.r.Event == nil || r.r.Event.EventID == x.eventID) &&
			!at.Before(x.notBefore) && (x.superseded == nil || !at.After(*x.superseded))
	}
	// the retry of the decision the record carries first: a re-drive
	// re-issues the same event, and a retry published in the millisecond
	// that superseded an earlier one fits both windows
	for _, x := range xs {
		if fits(x) && r.r.Decision.Retry.NotBefore.Time.Equal(x.notBefore) {
			return x
		}
	}
	for _, x := range xs {
		if fits(x) {
			return x
		}
	}
	return xs[len(xs)-1]
}

// heldExpired reads a dead letter of rule retry.held_expired: the RETRY
// decision it ends, which must have been held until 2 x its task's SLA after
// its due time (its lateness, whether a breaker still held it then, is
// checked with the publications', retryLateness).
func (c *checker) heldExpired(rec *kgo.Record, r *routed) {
	task := taskOf(r)
	c.actual(task, outputOf(topicspec.DeadLetter, r, ""))
	if r.r.Decision.Retry == nil || r.r.Decision.Route != event.RouteDeadLetter {
		c.violate("retry.held_expired", task, "dead letter %d@%d of rule %s carries route %s and retry plan %v, want DEADLETTER and the retry it gave up",
			rec.Partition, rec.Offset, policy.RuleRetryHeldExpired, r.r.Decision.Route, r.r.Decision.Retry)
		return
	}
	x := c.matchRetry(task, r)
	if x == nil {
		c.violate("retry.extra", task, "dead letter %d@%d gives up retry n=%d, which matches no RETRY decision of the task", rec.Partition, rec.Offset, r.r.Decision.Retry.N)
		return
	}
	x.gaveUp = append(x.gaveUp, r)
	c.rep.HeldExpired++
	if end := x.notBefore.Add(2 * time.Duration(x.slaMs) * time.Millisecond); r.at().Before(end) {
		c.violate("retry.held_expired", task, "retry n=%d (due %s) given up at %s, before its task's lifetime ended at %s (2 x SLA %dms after its due time)",
			x.n, stamp(x.notBefore), stamp(r.at()), stamp(end), x.slaMs)
	}
	if class := r.r.Decision.Class; class != x.class {
		c.violate("retry.class", task, "give-up of retry n=%d has class %s, want %s", x.n, class, x.class)
	}
}

// checkRetry checks what became of one RETRY decision.
func (c *checker) checkRetry(x *expectRetry) {
	ends := x.ends()
	switch {
	case len(ends) > 1:
		var at []string
		for _, p := range ends {
			at = append(at, fmt.Sprintf("%s %d@%d at %s", p.rec.Topic, p.rec.Partition, p.rec.Offset, stamp(p.at())))
		}
		c.violate("retry.duplicate", x.task, "retry n=%d of input %s published (or given up) %d times: %s", x.n, x.input.key, len(ends), strings.Join(at, ", "))
	case len(ends) == 0 && x.superseded == nil:
		c.violate("retry.missing", x.task, "retry n=%d of input %s (due %s) was never published and nothing superseded it",
			x.n, x.input.key, stamp(x.notBefore))
	case len(ends) == 0:
		c.rep.Superseded++
	}
	for _, p := range x.gaveUp {
		if x.superseded != nil && p.at().After(*x.superseded) {
			c.violate("retry.superseded", x.task, "retry n=%d given up at %s, after a later decision (%s) superseded it",
				x.n, stamp(p.at()), stamp(*x.superseded))
		}
	}
	for _, p := range x.published {
		at := p.at()
		switch {
		case at.Before(x.notBefore):
			c.violate("retry.early", x.task, "retry n=%d published at %s, before its due time %s", x.n, stamp(at), stamp(x.notBefore))
		case x.superseded != nil && at.After(*x.superseded):
			c.violate("retry.superseded", x.task, "retry n=%d published at %s, after a later decision (%s) superseded it",
				x.n, stamp(at), stamp(*x.superseded))
		}
		if p.r.Event == nil || p.r.Event.EventID != x.eventID {
			got := "no event"
			if p.r.Event != nil {
				got = p.r.Event.EventID
			}
			c.violate("retry.event", x.task, "retry n=%d re-issues %s, want event %s", x.n, got, x.eventID)
		}
		if p.r.Decision.Class != x.class {
			c.violate("retry.class", x.task, "retry n=%d has class %s, want %s", x.n, p.r.Decision.Class, x.class)
		}
	}
}

// checkAlerts checks the alerts topic: the immediate alerts (hallucination,
// budget) exactly once each, review SLA alerts when and only when an item
// stayed open past its owner's SLA, surge alerts justified by the audit
// stream, and the breaker transitions (package internal/router/hold).
func (c *checker) checkAlerts() {
	var transitions []transition
	for _, rec := range c.logs.Alerts {
		c.rep.Alerts++
		e, err := c.codec.DecodeBreakerEvent(rec.Value)
		if err != nil {
			c.violate("alerts.undecodable", string(rec.Key), "alert %d@%d does not decode: %v", rec.Partition, rec.Offset, err)
			continue
		}
		at := e.At.Time
		switch {
		case e.Kind == "TRANSITION":
			transitions = append(transitions, transition{rec: rec, e: e})
		case e.Kind != "ALERT":
			c.violate("alerts.kind", e.TaskID, "alert %d@%d has kind %q", rec.Partition, rec.Offset, e.Kind)
		case alertKind(rec, &e) == codec.AlertPartitions || alertKind(rec, &e) == codec.AlertRegistry:
			// about the cluster, not a task: the model predicts none
		case alertKind(rec, &e) == codec.AlertReviewOverdue:
			c.rep.SLAAlerts++
			c.slaAlert(rec, e)
		case alertKind(rec, &e) == codec.AlertBudget || alertKind(rec, &e) == codec.AlertQuarantined:
			c.actual(e.TaskID, Output{Topic: topicspec.Alerts, Class: string(e.Class), Rule: "ALERT " + string(e.Scope) + "/" + e.Key, At: stamp(at), Reason: e.Reason})
			k := alertKey{e.Scope, e.Key, e.TaskID, at.UnixMilli()}
			if c.alerts[k] == 0 {
				c.violate("alerts.extra", e.TaskID, "alert %d@%d %s/%s at %s (%s) answers no decision of the task at that time",
					rec.Partition, rec.Offset, e.Scope, e.Key, stamp(at), e.Class)
				continue
			}
			c.alerts[k]--
		default:
			c.rep.Surges++
			c.surge(rec, e)
		}
	}
	for k, n := range c.alerts {
		if n > 0 {
			c.violate("alerts.missing", k.task, "no ALERT %s/%s for the task's decision at %s", k.scope, k.key, stamp(time.UnixMilli(k.at)))
		}
	}
	for _, it := range c.items {
		end := c.logs.End
		switch {
		case len(it.alerted) > 1:
			c.violate("alerts.sla_duplicate", it.task, "review item opened at %s alerted %d times", stamp(it.opened), len(it.alerted))
		case len(it.alerted) == 0 && it.closed == nil && !end.IsZero() && end.Sub(it.due) > c.o.Settle:
			c.violate("alerts.sla_missing", it.task, "review item (%s) opened at %s, past its owner's SLA since %s and still open, never alerted",
				it.class, stamp(it.opened), stamp(it.due))
		}
		if len(it.alerted) > 0 {
			c.expected(it.task, Output{Topic: topicspec.Alerts, Class: string(it.class), Rule: "ALERT TASK/" + it.task, Note: "review SLA"})
		}
	}
	c.breakers(transitions)
}

// slaAlert matches a review SLA alert to the task's review item: the item
// was open at the alert's time, and that time is past the item's SLA.
func (c *checker) slaAlert(rec *kgo.Record, e event.BreakerEvent) {
	at := e.At.Time
	c.actual(e.TaskID, Output{Topic: topicspec.Alerts, Class: string(e.Class), Rule: "ALERT TASK/" + e.Key, At: stamp(at), Reason: e.Reason})
	for _, it := range c.items {
		if it.task != e.TaskID || at.Before(it.opened) || it.closed != nil && at.After(*it.closed) {
			continue
		}
		it.alerted = append(it.alerted, e)
		if at.Before(it.due) {
			c.violate("alerts.sla_early", e.TaskID, "review SLA alert at %s, before the item's SLA ran out (%s)", stamp(at), stamp(it.due))
		}
		if want := it.classAt(at); e.Class != want {
			c.violate("alerts.sla_class", e.TaskID, "review SLA alert of class %s at %s, the item's class then is %s", e.Class, stamp(at), want)
		}
		return
	}
	c.violate("alerts.sla_extra", e.TaskID, "review SLA alert %d@%d at %s, when the task had no open review item", rec.Partition, rec.Offset, stamp(at))
}

// surge checks that a surge alert is justified: within the surge window
// before it, the audit stream holds at least min_events decisions of its
// class for its key (an instance sees at most every decision).
func (c *checker) surge(rec *kgo.Record, e event.BreakerEvent) {
	s := c.o.Policy.Surge
	at := e.At.UnixMilli()
	if !slices.Contains(s.Classes, e.Class) {
		c.violate("surge.class", e.TaskID, "surge alert %d@%d for class %s, which the policy does not watch", rec.Partition, rec.Offset, e.Class)
		return
	}
	n := int32(0)
	for _, in := range c.inputs {
		if in.kind != inTask || in.audit == nil || in.decided.Class != e.Class || in.decided.Route == event.RouteDrop {
			continue
		}
		if t := in.audit.at().UnixMilli(); t > at || t <= at-s.WindowMs {
			continue
		}
		for _, r := range refs(&in.event) {
			if r.Scope.Name() == e.Scope && r.Key == e.Key {
				n++
			}
		}
	}
	if n < s.MinEvents {
		c.violate("surge.unjustified", e.TaskID, "surge alert %s/%s for %s at %s: the audit stream holds %d such decisions in the window, want >= %d",
			e.Scope, e.Key, e.Class, stamp(e.At.Time), n, s.MinEvents)
	}
}

// refs are the breakers a retry of ev would be published into.
func refs(ev *event.TaskEvent) []breaker.Ref { return policy.BreakerRefs(ev) }
