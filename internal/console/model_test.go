package console

import (
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Guards the view's review rules: the state of an item does not depend on
// the order the review, decisions and audit topics are read in (a rebuild
// reads them at different speeds); an item is open until the router's audit
// record for a decision appears, and a decision written for an earlier
// opening of the task does not count for the current one.
func TestReviewItemIsTheSameInEveryReadOrder(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	review := &event.Routed{Event: &event.TaskEvent{TaskID: "t-1", Provider: "openai", Model: "gpt-4o"},
		Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Review: &event.Review{Owner: "ai_product", SLAMs: 60_000}}}
	decision := &event.ReviewDecision{TaskID: "t-1", Approve: false, Reason: "unreadable", Reviewer: "alice"}
	audit := &event.Decision{Class: event.ClassModelRefusal, Route: event.RouteComplete, Rule: policy.RuleManualRejected, UserMessage: "msg"}
	steps := map[string]func(*reviewItem){
		"review":   func(it *reviewItem) { applyReview(it, review, t0) },
		"decision": func(it *reviewItem) { applyDecision(it, decision, t0.Add(time.Second)) },
		"audit":    func(it *reviewItem) { applyAudit(it, audit, t0.Add(2*time.Second)) },
	}
	orders := [][]string{
		{"review", "decision", "audit"}, {"review", "audit", "decision"}, {"decision", "review", "audit"},
		{"decision", "audit", "review"}, {"audit", "review", "decision"}, {"audit", "decision", "review"},
	}
	for _, order := range orders {
		it := &reviewItem{TaskID: "t-1"}
		for _, s := range order {
			steps[s](it)
		}
		if it.open() || it.Closed == nil || it.Closed.Rule != policy.RuleManualRejected || it.Decision == nil || it.Decision.Reviewer != "alice" {
			t.Errorf("order %v: open=%v closed=%+v decision=%+v, want closed by alice's reject", order, it.open(), it.Closed, it.Decision)
		}
	}

	// decided but not yet audited: still open, marked decided
	it := &reviewItem{TaskID: "t-1"}
	applyReview(it, review, t0)
	applyDecision(it, decision, t0.Add(time.Second))
	if !it.open() || it.decided() == nil {
		t.Errorf("decided, not audited: open=%v decided=%v, want open and decided", it.open(), it.decided())
	}
	// the task goes to review again: the old decision does not count
	applyAudit(it, audit, t0.Add(2*time.Second))
	applyReview(it, review, t0.Add(time.Minute))
	if !it.open() || it.decided() != nil {
		t.Errorf("reopened: open=%v decided=%v, want open and undecided", it.open(), it.decided())
	}
	if got := it.dueAt(); !got.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("due at %v, want the reopening plus the owner's SLA", got)
	}
}

// Guards the breaker view: the newest transition sets the state, an older one
// read late only joins the history, and a hallucination's latch is known
// until a transition to CLOSED.
func TestBreakerViewFollowsTheNewestTransition(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	var b breakerView
	applyTransition(&b, &event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "ship-v2", From: "CLOSED", To: "OPEN",
		Reason: "MODEL_HALLUCINATION: open until a person resets it", Failures: 1, Requests: 1}, true, t0.Add(time.Second))
	applyTransition(&b, &event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "ship-v2", From: "OPEN", To: "CLOSED", Reason: "old"}, false, t0)
	if b.State != "OPEN" || !b.Latched || len(b.Recent) != 2 || b.Recent[0].To != "OPEN" {
		t.Fatalf("after a late older transition: %+v, want OPEN latched with both in the history, newest first", b)
	}
	if got := b.failureRate(); got != "100% (1/1)" {
		t.Errorf("failure rate %q", got)
	}
	applyTransition(&b, &event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "ship-v2", From: "OPEN", To: "CLOSED", Reason: "alice reset"}, false, t0.Add(time.Minute))
	if b.State != "CLOSED" || b.Latched {
		t.Errorf("after the reset: %+v, want CLOSED and not latched", b)
	}
}
