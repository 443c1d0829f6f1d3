package policy

// prevented.go: cost prevented, the spending a blind retry loop would have
// added after the router stopped a task, and which decided task events are
// repeats of an attempt already counted. Pure: the router writes both on
// the audit record and counts them in its metrics, `faultrouter cost`, the
// console and the checker sum them from the audit topic.
//
// Cost prevented is claimed per task, not per stop. A task's state stands
// for a claim (Standing): once the task was stopped in its life, the
// attempts its baseline would still make after the attempts so far, at the
// task's mean attempt cost; nothing before. Each decided task event claims
// the change of its task's standing (Claim): its first stop the whole
// remainder, every later attempt of the task (a reviewer's approved retry,
// work for an ended task, a second stop) a negative amount, as the attempts
// made after the stop are netted off. So the claims of a task always add up
// to what its baseline had left after its last attempt, never more, however
// many times it stops. A re-drive reopens the task: the claim is given back
// unless the re-driven event stops it again. A task whose state expired
// starts a new life with a claim of its own.

import (
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// MaxBaselineRetries bounds cost_prevented.baseline_retries.
const MaxBaselineRetries = 1000

// CostPrevented states the blind baseline that cost prevented is measured
// against.
type CostPrevented struct {
	// BaselineRetries is how many times the baseline retries a failure
	// whatever it is: 1 + BaselineRetries attempts in all. Default 3.
	BaselineRetries int32 `yaml:"baseline_retries"`
}

// Stop says why the router stopped a task that a blind baseline would have
// retried.
type Stop string

// The stops that prevent cost.
const (
	// StopRefusal: a model refusal or schema violation sent to review, never
	// retried (a retried refusal is refused again).
	StopRefusal Stop = "refusal"
	// StopDeadLetter: a task dead-lettered (retries of its class or the
	// shared budget used up, a second 429 within the window).
	StopDeadLetter Stop = "dead_letter"
	// StopBudget: a task whose usage reached a budget limit, to review.
	StopBudget Stop = "budget"
	// StopUnknownWrite: a write whose outcome is unknown, held for
	// reconciliation instead of being run again.
	StopUnknownWrite Stop = "unknown_write"
)

// Stops lists every Stop, for labels and tables.
var Stops = []Stop{StopRefusal, StopDeadLetter, StopBudget, StopUnknownWrite}

// Prevented is the cost one stop prevented.
type Prevented struct {
	Stop Stop
	// Attempts are the attempts the baseline would still have made:
	// 1 + baseline_retries - the task's attempts so far, at least 0.
	Attempts int32
	// MeanUSD is the task's observed mean attempt cost: totals.cost_usd /
	// totals.attempts.
	MeanUSD float64
	// USD is Attempts x MeanUSD, rounded to the micro-dollar.
	USD float64
}

// StopOf reports which stop a decision of a task event is, if any.
func StopOf(d *event.Decision) (Stop, bool) {
	switch {
	case d.Route == event.RouteDrop:
		return "", false
	case d.Class == event.ClassBudgetExhausted:
		return StopBudget, true
	case d.Class == event.ClassOutcomeUnknown:
		return StopUnknownWrite, true
	case d.Route == event.RouteDeadLetter:
		return StopDeadLetter, true
	case (d.Class == event.ClassModelRefusal || d.Class == event.ClassSchemaViolation) && d.Route == event.RouteReview:
		return StopRefusal, true
	}
	return "", false
}

// PreventedBy returns the cost a decision of a task event prevented: for
// a stop (StopOf), the attempts the baseline would still have made times the
// task's mean attempt cost, both read from the decision's totals. A decision
// that is no stop prevents nothing (false); a stop after the baseline's last
// attempt prevents $0 (true, Attempts 0).
func (p *Policy) PreventedBy(d *event.Decision) (Prevented, bool) {
	stop, ok := StopOf(d)
	if !ok {
		return Prevented{}, false
	}
	pr := Prevented{Stop: stop}
	t := d.Totals
	if t.Attempts <= 0 {
		return pr, true
	}
	pr.Attempts = max(0, 1+p.CostPrevented.BaselineRetries-t.Attempts)
	pr.MeanUSD = float64(micros(t.CostUSD)) / 1e6 / float64(t.Attempts)
	n := int64(t.Attempts)
	pr.USD = float64((micros(t.CostUSD)*int64(pr.Attempts)+n/2)/n) / 1e6
	return pr, true
}

// PreventedRecord is PreventedBy in the form the audit record carries; nil
// when the decision is no stop. It is the claim of a stop read from its
// decision alone, as builds before Claim wrote it; the router now writes
// Claim's.
func (p *Policy) PreventedRecord(d *event.Decision) *event.Prevented {
	pr, ok := p.PreventedBy(d)
	if !ok {
		return nil
	}
	return &event.Prevented{Stop: string(pr.Stop), BaselineRetries: p.CostPrevented.BaselineRetries, Attempts: pr.Attempts, USD: pr.USD}
}

// Standing is the cost prevented a task's state stands for: the attempts
// its baseline would still make and their cost, once the task was stopped
// in its life (Stop is then the kind of that stop); zero before.
type Standing struct {
	Stop     Stop
	Attempts int32
	Micros   int64
}

// StandingOf returns the cost prevented st stands for. The state shows that
// its task was stopped when its review item was opened by a stop (a
// refusal or schema violation, a budget, a write whose outcome is unknown:
// the item's class stays while the item is approved, rejected or resolved by
// a receipt), or when the task ended otherwise than by a success, a
// duplicate or a review item (a dead letter). A task whose later review item
// is opened by another class no longer shows its earlier stop: its claim is
// given back (an under-count, never an over-count).
func (p *Policy) StandingOf(st *task.State) Standing {
	if st == nil || st.TaskID == "" {
		return Standing{}
	}
	stop := stateStop(st)
	if stop == "" {
		return Standing{}
	}
	s := Standing{Stop: stop}
	if n := st.Attempts; n > 0 {
		s.Attempts = max(0, 1+p.CostPrevented.BaselineRetries-n)
		s.Micros = (micros(st.CostUSD)*int64(s.Attempts) + int64(n)/2) / int64(n)
	}
	return s
}

// stateStop is the kind of stop st shows, "" if none (see StandingOf).
func stateStop(st *task.State) Stop {
	switch st.ReviewClass {
	case event.ClassModelRefusal, event.ClassSchemaViolation:
		return StopRefusal
	case event.ClassBudgetExhausted:
		return StopBudget
	case event.ClassOutcomeUnknown:
		return StopUnknownWrite
	}
	byReview := st.ReviewClass == st.TerminalClass && (st.Review == task.ReviewOpen || st.Review == task.ReviewRejected)
	if st.Terminal && !byReview && st.TerminalClass != "" && st.TerminalClass != event.ClassSucceeded && st.TerminalClass != event.ClassDuplicateExecution {
		return StopDeadLetter
	}
	return ""
}

// Claim is the cost prevented a decided task event claims, in the form the
// audit record carries: the change of its task's standing from before (the
// state before the decision; zero for a task the router did not know) to
// after. Its stop is the decision's own (StopOf), else the task's. Nil when
// the decision is no stop and changes nothing; a stop that claims nothing
// still carries its record (0 attempts), so that stops are counted.
func (p *Policy) Claim(before, after Standing, d *event.Decision) *event.Prevented {
	stop, isStop := StopOf(d)
	if !isStop {
		stop = after.Stop
		if stop == "" {
			stop = before.Stop
		}
	}
	da, dm := after.Attempts-before.Attempts, after.Micros-before.Micros
	if !isStop && da == 0 && dm == 0 {
		return nil
	}
	return &event.Prevented{Stop: string(stop), BaselineRetries: p.CostPrevented.BaselineRetries, Attempts: da, USD: float64(dm) / 1e6}
}

// Repeat says why the usage of a decided task event is not counted: it is
// an attempt already counted when it was first decided.
type Repeat string

// The repeats. An exact redelivery within the task's TTL is dropped (DROP)
// and is no repeat: it is no attempt at all.
const (
	// RepeatForwarded: a record on the wrong partition for its task; its
	// copy on the task's partition is the attempt.
	RepeatForwarded Repeat = "forwarded"
	// RepeatRedrive: an operator's re-drive of a recorded event.
	RepeatRedrive Repeat = "redrive"
	// RepeatAfterTTL: an event for a task the router has no state of (new,
	// or forgotten after its TTL) that was put on the ingress topic more
	// than 2 x the task's SLA after it occurred, longer than the task's
	// state lives: a redelivery of an attempt decided in an earlier life of
	// the task. (A worker that reports an attempt that late is taken for
	// one too.)
	RepeatAfterTTL Repeat = "redelivery_after_ttl"
)

// RepeatOf says whether a task event decided (not dropped) is a repeat:
// redrive reports faultrouter.redrive.* headers, known whether the router
// had a state of the task, produced the input record's timestamp.
func (p *Policy) RepeatOf(ev *event.TaskEvent, redrive, known bool, produced time.Time) Repeat {
	switch {
	case redrive:
		return RepeatRedrive
	case known || ev.OccurredAt.IsZero() || produced.IsZero():
		return ""
	}
	sla := p.DefaultSLAMs
	if ev.SLAMs != nil && *ev.SLAMs > 0 {
		sla = *ev.SLAMs
	}
	if produced.UnixMilli()-ev.OccurredAt.Millis() > 2*sla {
		return RepeatAfterTTL
	}
	return ""
}
