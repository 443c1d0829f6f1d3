package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// maxRateLimitTimes bounds State.RateLimitedAt: only the latest 429 times
// matter for the window.
const maxRateLimitTimes = 4

// Decide classifies ev given the task's history st, returns the decision and
// updates st in place. The caller has already dropped exact redeliveries
// (st.Seen(ev.EventID)); st.TaskID == "" is a new task.
//
// State updates: the event ID joins the dedup set (MarkSeen); Attempts and the
// usage totals grow; a RETRY counts in Retries and RetriesByClass and sets
// Pending; a 429 appends its occurred_at to RateLimitedAt; operations are
// recorded (a PARAMS_MISMATCH leaves the approved one untouched); REVIEW and
// QUARANTINE open a review item; every route but RETRY makes the task
// terminal; LastClass, LastRoute, LastEventAt, LastSeenAt, SLAMs and LastEvent
// follow the event. A DUPLICATE_EXECUTION for a terminal task only counts the
// event and its usage: the task's ending, review item and LastEvent stay.
//
// The most specific override matching the event's provider, model, action
// and prompt template, if any, decides it with its class sections, and the
// decision names it (Override).
func (p *Policy) Decide(ev *event.TaskEvent, st *task.State, now time.Time) event.Decision {
	if p.overrides != nil {
		if o := p.resolve(ev); o != nil {
			d := o.policy.decide(ev, st, now)
			d.Override = o.name
			return d
		}
	}
	return p.decide(ev, st, now)
}

// decide is Decide with p's own sections.
func (p *Policy) decide(ev *event.TaskEvent, st *task.State, now time.Time) event.Decision {
	if st.TaskID == "" {
		st.TaskID = ev.TaskID
	}
	st.MarkSeen(ev.EventID)
	st.Attempts++
	st.CostUSD = float64(micros(st.CostUSD)+micros(ev.Usage.CostUSD)) / 1e6
	st.Tokens += ev.Usage.Tokens
	st.ElapsedMs += ev.Usage.ElapsedMs
	st.LastEventAt = max(st.LastEventAt, ev.OccurredAt.Millis())
	st.LastSeenAt = now.UnixMilli()
	switch {
	case ev.SLAMs != nil:
		st.SLAMs = *ev.SLAMs
	case st.SLAMs == 0:
		st.SLAMs = p.DefaultSLAMs
	}

	v := p.classify(ev, st)
	if v.route == event.RouteRetry && st.Retries >= p.RetryBudget {
		v = verdict{
			class: v.class, route: event.RouteDeadLetter, rule: RuleRetryBudgetExhausted,
			reason: fmt.Sprintf("%s; but the task's shared retry budget is used up (%d of %d retries): terminal, dead letter",
				v.reason, st.Retries, p.RetryBudget),
			rateLimited: v.rateLimited,
		}
	}
	return p.apply(v, ev, st, now)
}

// apply turns a verdict into the decision and updates the state.
func (p *Policy) apply(v verdict, ev *event.TaskEvent, st *task.State, now time.Time) event.Decision {
	d := event.Decision{
		Class: v.class, Route: v.route, Rule: v.rule, Reason: v.reason,
		Feedback: v.feedback, SuggestedModel: v.suggestedModel,
		DecidedAt: event.At(now),
	}
	if v.rateLimited {
		st.RateLimitedAt = append(st.RateLimitedAt, ev.OccurredAt.Millis())
		if n := len(st.RateLimitedAt); n > maxRateLimitTimes {
			st.RateLimitedAt = slices.Clone(st.RateLimitedAt[n-maxRateLimitTimes:])
		}
	}
	st.LastClass, st.LastRoute = v.class, v.route
	if v.auditOnly {
		d.Totals = st.Totals()
		return d
	}

	p.recordOperation(ev.Operation, st, v)
	if !v.keepLastEvent || st.LastEvent == nil {
		st.SetLastEvent(ev) // a bounded copy
	}
	st.Pending = nil
	switch v.route {
	case event.RouteRetry:
		d.Retry = p.retry(st, v.class, v.delayMs, now)
	case event.RouteReview, event.RouteQuarantine:
		d.Review = p.review(v.esc)
		st.Review, st.ReviewClass = task.ReviewOpen, v.class
		st.Terminal, st.TerminalClass = true, v.class
	default: // COMPLETE, DEADLETTER
		if st.Review == task.ReviewOpen {
			st.Review = task.ReviewResolved
		}
		st.Terminal, st.TerminalClass = true, v.class
	}
	d.Totals = st.Totals()
	return d
}

// retry counts a retry of class and returns its plan. NotBefore is the
// router's clock plus the delay: the retry is published when due, so a
// consumer lag never makes it early.
func (p *Policy) retry(st *task.State, class event.Class, delayMs int64, now time.Time) *event.RetryPlan {
	st.Retries++
	if class != "" {
		if st.RetriesByClass == nil {
			st.RetriesByClass = make(map[event.Class]int32)
		}
		st.RetriesByClass[class]++
	}
	// in milliseconds, not a time.Duration: the delay is bounded by the
	// policy (validate.go), but a Duration of it would overflow past 292 years
	notBefore := event.FromMillis(now.UnixMilli() + max(delayMs, 0))
	r := &retryPlans{ // one allocation for both
		pending: task.PendingRetry{N: st.Retries, DelayMs: delayMs, NotBefore: notBefore.Millis()},
		plan:    event.RetryPlan{N: st.Retries, DelayMs: delayMs, NotBefore: notBefore},
	}
	st.Pending = &r.pending
	st.Terminal, st.TerminalClass = false, ""
	return &r.plan
}

// retryPlans are a retry's plan in the decision and in the task's state.
type retryPlans struct {
	pending task.PendingRetry
	plan    event.RetryPlan
}

func (p *Policy) review(e Escalation) *event.Review {
	return &event.Review{Owner: e.Owner, SLAMs: p.Owners[e.Owner].SLAMs, Priority: e.Priority}
}

// recordOperation remembers the event's operation. The first params_sha256
// recorded for an op_id is the approved one and never changes; a resolved
// operation (CONFIRMED or REJECTED) keeps its state, and one a reviewer
// reconciled (task.OpReconciled) changes only with a receipt.
func (p *Policy) recordOperation(op *event.Operation, st *task.State, v verdict) {
	if op == nil || v.class == event.ClassParamsMismatch {
		return
	}
	known := st.Op(op.OpID)
	if known == nil {
		st.AddOperation(task.Operation{
			OpID: op.OpID, Kind: op.Kind, ParamsSHA256: op.ParamsSHA256, State: op.State,
		})
		return
	}
	if known.ParamsSHA256 == "" {
		known.SetParams(op.ParamsSHA256)
	}
	switch {
	case known.State == event.OpConfirmed || known.State == event.OpRejected:
		// resolved: keeps its state
	case known.State == task.OpReconciled && op.State != event.OpConfirmed && op.State != event.OpRejected:
		// closed by a person: only a receipt changes it
	default:
		known.State = op.State
	}
}

// Drop returns the DROP decision for an exact redelivery of an event already
// routed for the task. It changes nothing. Its class is the task's latest
// class (UNCLASSIFIED if the task has none).
func (p *Policy) Drop(ev *event.TaskEvent, st *task.State, now time.Time) event.Decision {
	return event.Decision{
		Class: lastClass(st), Route: event.RouteDrop, Rule: RuleRedelivery,
		Reason:    "event " + ev.EventID + " was already routed for task " + ev.TaskID + ": exact redelivery, dropped",
		Totals:    st.Totals(),
		DecidedAt: event.At(now),
	}
}

// Explain is Decide for ev on a fresh task state, for `policy explain`.
func (p *Policy) Explain(ev *event.TaskEvent, now time.Time) event.Decision {
	var st task.State
	return p.Decide(ev, &st, now)
}

func lastClass(st *task.State) event.Class {
	if st.LastClass != "" {
		return st.LastClass
	}
	return event.ClassUnclassified
}

// phrases returns the compiled refusal-phrase library; a Policy that was
// never validated compiles it on every call.
func (p *Policy) phrases() *phraseSet {
	if p.refusalSet != nil {
		return p.refusalSet
	}
	return compilePhrases(p.ModelRefusal.allPhrases())
}

// micros is a dollar amount in whole micro-dollars: budgets compare money
// exactly, so that 0.1 + 0.2 + 0.2 is exactly the $0.50 limit.
func micros(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// dollars formats an amount with at least two decimals: 0.50, 0.499999.
func dollars(usd float64) string {
	s := strconv.FormatFloat(float64(micros(usd))/1e6, 'f', -1, 64)
	i := strings.IndexByte(s, '.')
	switch {
	case i < 0:
		return s + ".00"
	case len(s)-i == 2:
		return s + "0"
	}
	return s
}
