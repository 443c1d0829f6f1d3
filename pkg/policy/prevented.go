package policy

// prevented.go: cost prevented, the spending a blind retry loop would have
// added after the router stopped a task. Pure: the router counts it in its
// metrics, `faultrouter cost` sums it from the audit topic, and both read it
// from the decision alone.

import "github.com/faultrouter/faultrouter/pkg/event"

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
// when the decision is no stop.
func (p *Policy) PreventedRecord(d *event.Decision) *event.Prevented {
	pr, ok := p.PreventedBy(d)
	if !ok {
		return nil
	}
	return &event.Prevented{Stop: string(pr.Stop), BaselineRetries: p.CostPrevented.BaselineRetries, Attempts: pr.Attempts, USD: pr.USD}
}
