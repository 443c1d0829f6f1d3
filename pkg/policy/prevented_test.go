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

// TestClaimsNeverExceedTheBaseline guards cost prevented per task: a write
// whose outcome is unknown, approved by a reviewer, then unknown again,
// claims what its baseline (4 attempts) had left after its 2 attempts, not
// 3 + 2: the first stop claims 3, the second nets off the attempt made
// after it. Work reported for the task after the dead letter of another
// task nets off too, and a task that is never stopped claims nothing.
func TestClaimsNeverExceedTheBaseline(t *testing.T) {
	p := Default()
	at := time.Date(2026, 3, 5, 3, 17, 0, 0, time.UTC)
	write := func(id string, n int32) *event.TaskEvent {
		return &event.TaskEvent{EventID: id, TaskID: "pay-1", Attempt: n, OccurredAt: event.At(at), Action: "refund",
			Stage: event.StageBusiness, Status: event.StatusError, Error: &event.Error{Type: "TimeoutError"},
			Operation: &event.Operation{OpID: "op-1", Kind: event.OpWrite, ParamsSHA256: "abc", State: event.OpUnknown},
			Usage:     event.Usage{CostUSD: 0.10}}
	}
	var st task.State
	var claimed int32
	var usd float64
	decide := func(ev *event.TaskEvent) event.Decision {
		before := p.StandingOf(&st)
		d := p.DecideEvent(ev, &st, nil, at)
		if pr := p.Claim(before, p.StandingOf(&st), &d); pr != nil {
			claimed += pr.Attempts
			usd += pr.USD
		}
		return d
	}
	if d := decide(write("e1", 1)); d.Class != event.ClassOutcomeUnknown || claimed != 3 {
		t.Fatalf("first unknown write: %s/%s, claimed %d; want OUTCOME_UNKNOWN and 3 attempts", d.Class, d.Route, claimed)
	}
	if d := p.DecideReview(&event.ReviewDecision{TaskID: "pay-1", Approve: true, Reason: "not executed"}, &st, at); d.Route != event.RouteRetry {
		t.Fatalf("approval: %s", d.Route)
	}
	if d := decide(write("e2", 2)); d.Class != event.ClassOutcomeUnknown {
		t.Fatalf("second unknown write: %s/%s", d.Class, d.Route)
	}
	if claimed != 2 || fmt.Sprintf("%.6f", usd) != "0.200000" {
		t.Errorf("claimed %d attempts, $%.6f; want 2 attempts at the mean $0.10 = $0.20 (the baseline had 3 left, 1 made after the stop)", claimed, usd)
	}
	// a redelivery claims nothing; so does a task that never stops
	if d := decide(write("e2", 2)); d.Route != event.RouteDrop || claimed != 2 {
		t.Errorf("a redelivery: %s, claimed %d; want DROP, still 2", d.Route, claimed)
	}
	st, claimed = task.State{}, 0
	ok := &event.TaskEvent{EventID: "s1", TaskID: "t-ok", Attempt: 1, OccurredAt: event.At(at), Status: event.StatusOK, Usage: event.Usage{CostUSD: 0.2}}
	if decide(ok); claimed != 0 {
		t.Errorf("a success claimed %d attempts", claimed)
	}
	// a dead letter after 3 timeouts claims 1; work reported after it nets
	// that off
	st, claimed = task.State{}, 0
	timeout := func(id string) *event.TaskEvent {
		return &event.TaskEvent{EventID: id, TaskID: "t-dl", Attempt: 1, OccurredAt: event.At(at), Stage: event.StageNetwork,
			Status: event.StatusError, Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}, Usage: event.Usage{CostUSD: 0.01}}
	}
	for _, id := range []string{"a", "b", "c"} {
		decide(timeout(id))
	}
	if claimed != 1 {
		t.Fatalf("dead letter after 3 attempts: claimed %d, want 1", claimed)
	}
	if d := decide(timeout("d")); d.Class != event.ClassDuplicateExecution || claimed != 0 {
		t.Errorf("work after the dead letter: %s, claimed %d in all; want DUPLICATE_EXECUTION and 0", d.Class, claimed)
	}
}

// TestRepeatAfterTTL guards which decided events are repeats of an attempt
// already counted: a re-drive; an event for a task the router has no state
// of that was produced more than 2 x its SLA after it occurred; nothing
// else (a known task, a fresh event, an event with no occurred_at).
func TestRepeatAfterTTL(t *testing.T) {
	p := Default()
	at := time.Date(2026, 3, 5, 3, 17, 0, 0, time.UTC)
	sla := int64(60_000)
	ev := &event.TaskEvent{EventID: "e", TaskID: "t", OccurredAt: event.At(at), SLAMs: &sla}
	for _, c := range []struct {
		name           string
		redrive, known bool
		produced       time.Time
		want           Repeat
	}{
		{"re-drive", true, true, at, RepeatRedrive},
		{"fresh", false, false, at.Add(time.Second), ""},
		{"late, known task", false, true, at.Add(time.Hour), ""},
		{"after the TTL", false, false, at.Add(2*time.Minute + time.Millisecond), RepeatAfterTTL},
		{"at the TTL", false, false, at.Add(2 * time.Minute), ""},
	} {
		if got := p.RepeatOf(ev, c.redrive, c.known, c.produced); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	noSLA := &event.TaskEvent{EventID: "e", TaskID: "t", OccurredAt: event.At(at)}
	if got := p.RepeatOf(noSLA, false, false, at.Add(47*time.Hour)); got != "" {
		t.Errorf("47 h late against the default SLA of 24 h: %q, want none", got)
	}
}
