package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// TestPreventedValidationLoop guards the definition of cost prevented with
// the validation loop of the field report: a contract-parsing task whose
// validator rejected it 137 times at about $1.73 an attempt ($237). Under the
// default policy its first attempt already reaches the $0.50 budget: a budget
// stop after 1 attempt. Against the stated baseline (3 retries) that prevents
// 3 x $1.73 = $5.19; against the loop that ran (136 retries) $235.28, which
// with the $1.73 spent is the report's $237.
func TestPreventedValidationLoop(t *testing.T) {
	at := time.Date(2026, 3, 5, 3, 17, 0, 0, time.UTC)
	ev := &event.TaskEvent{
		EventID: "contract-42-a1", TaskID: "contract-42", Attempt: 1, OccurredAt: event.At(at),
		Action: "contract_review", Provider: "anthropic", Model: "claude-3", PromptTemplate: "contract-parse-v1",
		Stage: event.StageBusiness, Status: event.StatusError,
		Error: &event.Error{Type: "ValidationError", Code: "CODE_2101", Message: "clauses 7 and 12 conflict"},
		Usage: event.Usage{CostUSD: 1.73, Tokens: 1200, ElapsedMs: 1400},
	}
	for _, c := range []struct {
		baseline int32
		attempts int32
		usd      float64
	}{{3, 3, 5.19}, {136, 136, 235.28}, {0, 0, 0}} {
		t.Run(fmt.Sprintf("baseline_%d", c.baseline), func(t *testing.T) {
			p := Default()
			p.CostPrevented.BaselineRetries = c.baseline
			var st task.State
			d := p.Decide(ev, &st, at)
			if d.Class != event.ClassBudgetExhausted || d.Route != event.RouteReview {
				t.Fatalf("decided %s/%s, want BUDGET_EXHAUSTED/REVIEW", d.Class, d.Route)
			}
			pr, ok := p.PreventedBy(&d)
			if !ok || pr.Stop != StopBudget || pr.Attempts != c.attempts || pr.USD != c.usd || pr.MeanUSD != 1.73 {
				t.Errorf("prevented %+v (stop %v), want stop budget, %d attempts of $1.73, $%v", pr, ok, c.attempts, c.usd)
			}
		})
	}
}

// TestStops guards which decisions count as stops: the four of the
// definition, and no other (a retry, a success, a redelivery, a business
// rejection to review, a quarantine).
func TestStops(t *testing.T) {
	totals := event.Totals{Attempts: 2, CostUSD: 0.03}
	for _, c := range []struct {
		class event.Class
		route event.Route
		stop  Stop
	}{
		{event.ClassModelRefusal, event.RouteReview, StopRefusal},
		{event.ClassSchemaViolation, event.RouteReview, StopRefusal},
		{event.ClassNetworkTimeout, event.RouteDeadLetter, StopDeadLetter},
		{event.ClassRateLimitExceeded, event.RouteDeadLetter, StopDeadLetter},
		{event.ClassBudgetExhausted, event.RouteReview, StopBudget},
		{event.ClassOutcomeUnknown, event.RouteReview, StopUnknownWrite},
		{event.ClassNetworkTimeout, event.RouteRetry, ""},
		{event.ClassSucceeded, event.RouteComplete, ""},
		{event.ClassModelRefusal, event.RouteDrop, ""},
		{event.ClassBusinessRejected, event.RouteReview, ""},
		{event.ClassHallucination, event.RouteQuarantine, ""},
		{event.ClassDuplicateExecution, event.RouteComplete, ""},
	} {
		d := event.Decision{Class: c.class, Route: c.route, Totals: totals}
		pr, ok := Default().PreventedBy(&d)
		if ok != (c.stop != "") || pr.Stop != c.stop {
			t.Errorf("%s/%s: stop %q (%v), want %q", c.class, c.route, pr.Stop, ok, c.stop)
			continue
		}
		// 2 attempts made of the baseline's 4: 2 more at the mean $0.015
		if ok && (pr.Attempts != 2 || pr.USD != 0.03) {
			t.Errorf("%s/%s: prevented %+v, want 2 attempts, $0.03", c.class, c.route, pr)
		}
	}
}

// TestBaselineRetriesValidated guards the policy file: a baseline outside
// 0..1000 is one error naming the field.
func TestBaselineRetriesValidated(t *testing.T) {
	_, err := Parse([]byte("cost_prevented:\n  baseline_retries: -1\n"))
	if err == nil || !strings.Contains(err.Error(), "cost_prevented.baseline_retries") {
		t.Fatalf("err %v, want one naming cost_prevented.baseline_retries", err)
	}
	p, err := Parse([]byte("cost_prevented:\n  baseline_retries: 5\n"))
	if err != nil || p.CostPrevented.BaselineRetries != 5 {
		t.Fatalf("parsed %v, %v; want baseline 5", p, err)
	}
}
