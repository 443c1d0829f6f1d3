package policy

// commands.go: the decisions the router makes on its own, not from a
// worker's event: a record it cannot accept, a pending retry that has come
// due (or that breakers held past its task's lifetime), a breaker command
// (RESET or LATCH) on the decisions topic, a record on the wrong partition
// for its task. Pure functions, like Decide.

import (
	"fmt"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Poison is the decision for an input record the router cannot accept
// (undecodable, unknown schema, no key, key differs from task_id,
// oversize): INVALID_INPUT to the dead-letter topic, rule input.<kind>.
func Poison(kind string, err error, now time.Time) event.Decision {
	return event.Decision{
		Class: event.ClassInvalidInput, Route: event.RouteDeadLetter,
		Rule: InputRule(kind), Reason: err.Error(), DecidedAt: event.At(now),
	}
}

// RetryDue reports whether the task's pending retry is due at now, and its
// decision: the retry planned earlier, published now, rule retry.due.
func RetryDue(st *task.State, now time.Time) (event.Decision, bool) {
	if st.Pending == nil || st.Pending.NotBefore > now.UnixMilli() || st.LastEvent == nil {
		return event.Decision{}, false
	}
	p := st.Pending
	return event.Decision{
		Class: st.LastClass, Route: event.RouteRetry, Rule: RuleRetryDue,
		Reason: fmt.Sprintf("retry %d is due (not before %s)", p.N, event.FromMillis(p.NotBefore).Format(time.RFC3339Nano)),
		Retry:  &event.RetryPlan{N: p.N, DelayMs: p.DelayMs, NotBefore: event.FromMillis(p.NotBefore)},
		Totals: st.Totals(), DecidedAt: event.At(now),
	}, true
}

// HeldRetryExpiry is when a retry that breakers hold is given up (router
// clock, ms): 2 x the task's SLA after the retry's own due time, when the
// task would have expired had the retry been published then. A breaker that
// stays open or half-open past it (a provider or downstream that never
// comes back, a template latched for days) does not keep the task, its
// state and its breakers forever: the retry goes to the dead-letter topic
// instead (RetryHeldExpired), from where a person re-drives it once the
// breaker has closed. 0 when st has no pending retry.
func (p *Policy) HeldRetryExpiry(st *task.State) int64 {
	if st.Pending == nil {
		return 0
	}
	sla := st.SLAMs
	if sla <= 0 {
		sla = p.DefaultSLAMs
	}
	return st.Pending.Due() + 2*sla
}

// RetryHeldExpired is the decision for a pending retry that breakers held
// until HeldRetryExpiry: the retry planned earlier (its number and due
// time), never published, to the dead-letter topic, rule
// retry.held_expired. holding names the breakers that held it.
func RetryHeldExpired(st *task.State, holding string, now time.Time) event.Decision {
	p := st.Pending
	due := event.FromMillis(p.Due())
	return event.Decision{
		Class: st.LastClass, Route: event.RouteDeadLetter, Rule: RuleRetryHeldExpired,
		Reason: fmt.Sprintf("retry %d (due %s) was held behind %s until its task's lifetime ended (2 x SLA after its due time): "+
			"never published; re-drive the task once the breaker has closed", p.N, due.Format(time.RFC3339Nano), holding),
		Retry:  &event.RetryPlan{N: p.N, DelayMs: p.DelayMs, NotBefore: due},
		Totals: st.Totals(), DecidedAt: event.At(now),
	}
}

// BreakerCommand reads a breaker command (a BreakerEvent of kind RESET or
// LATCH on the decisions topic): the breaker it names, or the decision for
// a command that names none (DROP, rule breaker.<kind>_invalid; it changes
// nothing).
func BreakerCommand(c *event.BreakerEvent, now time.Time) (breaker.Ref, *event.Decision) {
	scope, err := breaker.ParseScope(c.Scope)
	if err == nil && c.Key != "" && (c.Kind == event.BreakerKindReset || c.Kind == event.BreakerKindLatch) {
		return breaker.Ref{Scope: scope, Key: c.Key}, nil
	}
	return breaker.Ref{}, &event.Decision{
		Class: event.ClassUnclassified, Route: event.RouteDrop, Rule: breakerRule(c.Kind) + "_invalid",
		Reason: fmt.Sprintf("breaker %s names scope %q key %q: want a scope of PROVIDER_MODEL, DOWNSTREAM, PROMPT_TEMPLATE and a key",
			commandName(c.Kind), c.Scope, c.Key),
		DecidedAt: event.At(now),
	}
}

// BreakerCommandApplied is the decision for a valid breaker command once
// applied: class UNCLASSIFIED (it is no task's failure), route COMPLETE,
// rule breaker.reset or breaker.latch. changed tells whether it changed this
// instance's breaker; a command repeated on every decisions partition
// changes it once.
func BreakerCommandApplied(c *event.BreakerEvent, ref breaker.Ref, changed bool, now time.Time) event.Decision {
	who := c.Instance
	if who == "" {
		who = "an operator"
	}
	d := event.Decision{Class: event.ClassUnclassified, Route: event.RouteComplete, Rule: breakerRule(c.Kind), DecidedAt: event.At(now)}
	switch {
	case c.Kind == event.BreakerKindLatch && changed:
		d.Reason = fmt.Sprintf("%s latched %s open: %s", who, ref, c.Reason)
	case c.Kind == event.BreakerKindLatch:
		d.Reason = fmt.Sprintf("%s latched %s open (%s); it is already latched here", who, ref, c.Reason)
	case changed:
		d.Reason = fmt.Sprintf("%s reset %s: %s", who, ref, c.Reason)
	default:
		d.Reason = fmt.Sprintf("%s asked to reset %s (%s); it is already closed here", who, ref, c.Reason)
	}
	return d
}

// BreakerCommandAudited is the decision for a valid breaker command where
// the breakers topic carries the reset or latch it was written with (in the
// same transaction): class UNCLASSIFIED, route COMPLETE, rule breaker.reset
// or breaker.latch. The command changes no breaker where it is read: every
// instance applies the breakers topic's record in that topic's order.
func BreakerCommandAudited(c *event.BreakerEvent, ref breaker.Ref, now time.Time) event.Decision {
	who := c.Instance
	if who == "" {
		who = "an operator"
	}
	d := event.Decision{Class: event.ClassUnclassified, Route: event.RouteComplete, Rule: breakerRule(c.Kind), DecidedAt: event.At(now)}
	if c.Kind == event.BreakerKindLatch {
		d.Reason = fmt.Sprintf("%s latched %s open: %s (applied from the breakers topic, in its order)", who, ref, c.Reason)
	} else {
		d.Reason = fmt.Sprintf("%s reset %s: %s (applied from the breakers topic, in its order)", who, ref, c.Reason)
	}
	return d
}

func commandName(kind string) string {
	if kind == event.BreakerKindLatch {
		return "latch"
	}
	return "reset"
}

// Forward is the decision for a record on the wrong partition of its topic
// for its task: it is forwarded to the task's partition (where it is routed)
// and audited here with class UNCLASSIFIED, route COMPLETE and rule
// partition.forward. The class of the task's event is decided once, on
// the task's partition.
func Forward(taskID, topic string, from, to, partitions int32, now time.Time) event.Decision {
	return event.Decision{
		Class: event.ClassUnclassified, Route: event.RouteComplete, Rule: RulePartitionForward,
		Reason: fmt.Sprintf("task %s belongs to partition %d of %s (murmur2 of the key over %d partitions), not %d: forwarded",
			taskID, to, topic, partitions, from),
		DecidedAt: event.At(now),
	}
}
