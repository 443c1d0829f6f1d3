package whatif

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// decided builds one replayed input: a task event of cost usd decided
// route, recorded as the model decided it.
func decided(task, input string, usd float64, class event.Class, route event.Route, attempts int32) checker.Decided {
	d := event.Decision{Class: class, Route: route, Rule: string(class) + "." + string(route), Totals: event.Totals{Attempts: attempts}}
	if route == event.RouteRetry {
		d.Retry = &event.RetryPlan{N: attempts, DelayMs: 1000}
	}
	if route == event.RouteReview {
		d.Review = &event.Review{Owner: policy.OwnerAIProduct}
	}
	ev := &event.TaskEvent{TaskID: task, EventID: input, Provider: "openai", Model: "gpt-4o", Usage: event.Usage{CostUSD: usd}}
	return checker.Decided{Task: task, Input: input, At: t0, Event: ev, Audited: true, Recorded: d, Model: d}
}

// TestCompareCountsWhatChanges guards the what-if's arithmetic: changed
// decisions and tasks, the matrix cell with its example, retries added and
// removed, review load per owner, the observed cost of the attempts after a
// retry the candidate drops and the estimated cost of a retry it adds (the
// observed mean of its class and provider/model).
func TestCompareCountsWhatChanges(t *testing.T) {
	base := []checker.Decided{
		// task a: the candidate stops after the first attempt; two more
		// attempts ($0.02 + $0.03) happened after it
		decided("a", "i/0@0", 0.01, event.ClassNetworkTimeout, event.RouteRetry, 1),
		decided("a", "i/0@1", 0.02, event.ClassNetworkTimeout, event.RouteRetry, 2),
		decided("a", "i/0@2", 0.03, event.ClassSucceeded, event.RouteComplete, 3),
		// task b: the candidate retries a timeout the baseline dead-lettered
		decided("b", "i/1@0", 0.05, event.ClassNetworkTimeout, event.RouteDeadLetter, 1),
		// task c: a refusal to review, unchanged
		decided("c", "i/2@0", 0.04, event.ClassModelRefusal, event.RouteReview, 1),
	}
	cand := make([]checker.Decided, len(base))
	copy(cand, base)
	stop := func(i int, class event.Class, route event.Route) {
		cand[i].Model = event.Decision{Class: class, Route: route, Rule: "x"}
	}
	stop(0, event.ClassNetworkTimeout, event.RouteDeadLetter)
	stop(1, event.ClassDuplicateExecution, event.RouteComplete)
	stop(2, event.ClassDuplicateExecution, event.RouteComplete)
	cand[3].Model = event.Decision{Class: event.ClassNetworkTimeout, Route: event.RouteRetry, Rule: "r", Retry: &event.RetryPlan{N: 1, DelayMs: 1000}}

	r, err := Compare(base, cand, Options{Baseline: policy.Default(), Candidate: policy.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Changed != 4 || r.ChangedTasks != 2 || r.Disagreements != 0 || r.Tasks != 3 || r.Decisions != 5 {
		t.Errorf("changed %d of %d tasks, %d disagreements, %d tasks, %d decisions; want 4 of 2, 0, 3, 5",
			r.Changed, r.ChangedTasks, r.Disagreements, r.Tasks, r.Decisions)
	}
	if r.Retries != (Retries{Baseline: 2, Candidate: 1, Added: 1, Removed: 2}) {
		t.Errorf("retries %+v, want baseline 2, candidate 1, 1 added (b), 2 removed (a)", r.Retries)
	}
	// observed: a's attempts 2 and 3; estimated: b's retry at the mean of
	// NETWORK_TIMEOUT on openai/gpt-4o, ($0.01 + $0.02 + $0.05) / 3
	c := r.Cost
	if c.RemovedAttempts != 2 || c.RemovedUSD != 0.05 || c.AddedAttempts != 1 || c.AddedUSD != 0.026667 || c.NetUSD != -0.023333 || c.ObservedUSD != 0.15 {
		t.Errorf("cost %+v", c)
	}
	var cell *Cell
	for i := range r.Matrix {
		if r.Matrix[i].Class == event.ClassNetworkTimeout && r.Matrix[i].From == event.RouteDeadLetter {
			cell = &r.Matrix[i]
		}
	}
	if cell == nil || !cell.Changed || cell.To != event.RouteRetry || cell.Count != 1 || len(cell.Examples) != 1 || cell.Examples[0] != "b" {
		t.Errorf("cell NETWORK_TIMEOUT DEADLETTER: %+v, want -> RETRY, 1, example b", cell)
	}
	if len(r.Review) != 1 || r.Review[0].Owner != policy.OwnerAIProduct || r.Review[0].Baseline != 1 || r.Review[0].Candidate != 1 {
		t.Errorf("review load %+v, want ai_product 1 and 1", r.Review)
	}
	if len(r.Changes) != 4 || r.Changes[0].Task != "a" || r.Changes[3].Task != "b" {
		t.Errorf("changes %+v", r.Changes)
	}
	// the example tasks' timelines: every decision of a and b, none of c
	if len(r.Timelines) != 2 || len(r.Timelines["c"]) != 0 {
		t.Errorf("timelines of %d tasks (c: %d steps), want a and b only", len(r.Timelines), len(r.Timelines["c"]))
	}
	a := r.Timelines["a"]
	if len(a) != 3 || a[0].Input != "i/0@0" || a[2].Input != "i/0@2" || !a[0].Changed ||
		a[0].BaselineRoute != event.RouteRetry || a[0].CandidateRoute != event.RouteDeadLetter || a[2].BaselineRoute != event.RouteComplete {
		t.Errorf("timeline of a: %+v, want its three decisions, RETRY -> DEADLETTER first", a)
	}
	var out bytes.Buffer
	if err := r.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "i/0@2") || !strings.Contains(out.String(), "SUCCEEDED COMPLETE") {
		t.Errorf("the table does not tell a's story:\n%s", out.String())
	}
}

// TestCompareSaysWhyItDisagrees guards the self-check: a task whose first
// decision in the range recorded more attempts than the replay counts
// started before the range; any other difference is put down to the
// baseline; an input without an audit record is named as such.
func TestCompareSaysWhyItDisagrees(t *testing.T) {
	late := decided("late", "i/0@5", 0.01, event.ClassNetworkTimeout, event.RouteRetry, 1)
	late.Recorded.Totals.Attempts = 3
	late.Diff = "totals differ"
	other := decided("other", "i/1@0", 0.01, event.ClassNetworkTimeout, event.RouteRetry, 1)
	other.Diff = "reason differs"
	lost := decided("lost", "i/2@0", 0.01, event.ClassNetworkTimeout, event.RouteRetry, 1)
	lost.Audited, lost.Model, lost.Diff = false, event.Decision{}, "no audit record"
	base := []checker.Decided{late, other, lost}
	r, err := Compare(base, base, Options{Baseline: policy.Default(), Candidate: policy.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Disagreements != 3 || r.Why[WhyRangeStart] != 1 || r.Why[WhyPolicy] != 1 || r.Why[WhyNoAudit] != 1 || r.Changed != 0 {
		t.Errorf("disagreements %d, why %v, changed %d; want 3, one of each, 0", r.Disagreements, r.Why, r.Changed)
	}
}

// TestCompareRefusesOtherInputs guards against comparing replays of
// different logs: a length or input mismatch is an error.
func TestCompareRefusesOtherInputs(t *testing.T) {
	a := []checker.Decided{decided("a", "i/0@0", 0.01, event.ClassSucceeded, event.RouteComplete, 1)}
	b := []checker.Decided{decided("a", "i/0@1", 0.01, event.ClassSucceeded, event.RouteComplete, 1)}
	if _, err := Compare(a, b, Options{Baseline: policy.Default(), Candidate: policy.Default()}); err == nil {
		t.Error("replays of different inputs compared without an error")
	}
	if _, err := Compare(a, nil, Options{Baseline: policy.Default(), Candidate: policy.Default()}); err == nil {
		t.Error("replays of different lengths compared without an error")
	}
}

// TestBreakerOpenings guards the estimated breaker openings: 25 timeouts of
// one provider/model within a minute open its breaker under the baseline;
// a candidate that decides them otherwise (here: successes) opens nothing.
func TestBreakerOpenings(t *testing.T) {
	var base, cand []checker.Decided
	for i := range 25 {
		d := decided(fmt.Sprint("t", i), fmt.Sprintf("i/0@%d", i), 0.01, event.ClassNetworkTimeout, event.RouteRetry, 1)
		d.At = t0.Add(time.Duration(i) * time.Second)
		d.Event.Stage = event.StageNetwork
		base = append(base, d)
		d.Model = event.Decision{Class: event.ClassSucceeded, Route: event.RouteComplete}
		cand = append(cand, d)
	}
	r, err := Compare(base, cand, Options{Baseline: policy.Default(), Candidate: policy.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Breakers) != 1 || r.Breakers[0] != (BreakerRow{Breaker: "PROVIDER_MODEL/openai/gpt-4o", Baseline: 1, Candidate: 0}) {
		t.Errorf("breaker openings %+v, want PROVIDER_MODEL/openai/gpt-4o 1 -> 0", r.Breakers)
	}
}

// TestReviewLoadWithinSLA guards the review load's SLA counts: an item is
// answered by the task's next review decision, at the time it was really
// made; within SLA is judged by each policy's owner SLA (here the candidate
// shortens ai_product's to 30 min, so the 1 h answer misses it), and an item
// nobody answered in the range counts as unanswered.
func TestReviewLoadWithinSLA(t *testing.T) {
	answered := decided("c", "i/2@0", 0.04, event.ClassModelRefusal, event.RouteReview, 1)
	decision := checker.Decided{Task: "c", Input: "d/2@0", At: t0.Add(time.Hour), Review: &event.ReviewDecision{TaskID: "c", Approve: true},
		Audited: true, Recorded: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteRetry, Rule: "MANUAL_OVERRIDE_SUCCESS"}}
	decision.Model = decision.Recorded
	open := decided("d", "i/3@0", 0.04, event.ClassModelRefusal, event.RouteReview, 1)
	base := []checker.Decided{answered, decision, open}
	cand := policy.Default()
	cand.Owners[policy.OwnerAIProduct] = policy.Owner{SLAMs: 30 * 60_000}
	r, err := Compare(base, base, Options{Baseline: policy.Default(), Candidate: cand})
	if err != nil {
		t.Fatal(err)
	}
	want := OwnerLoad{Owner: policy.OwnerAIProduct, SLAMs: 30 * 60_000, Baseline: 2, Candidate: 2, BaselinePerDay: 2, CandidatePerDay: 2,
		BaselineWithinSLA: 1, CandidateWithinSLA: 0, BaselineUnanswered: 1, CandidateUnanswered: 1}
	if len(r.Review) != 1 || r.Review[0] != want {
		t.Errorf("review load %+v\nwant %+v", r.Review, want)
	}
}

// TestCompareCountsOwnerAndPriorityChanges guards what counts as a changed
// decision: the same route with the review item given to another owner, or
// at another priority, is a change (a team's queue or its pager differs);
// the same owner and priority is not.
func TestCompareCountsOwnerAndPriorityChanges(t *testing.T) {
	base := []checker.Decided{
		decided("owner", "i/0@0", 0.01, event.ClassModelRefusal, event.RouteReview, 1),
		decided("priority", "i/1@0", 0.01, event.ClassModelRefusal, event.RouteReview, 1),
		decided("same", "i/2@0", 0.01, event.ClassModelRefusal, event.RouteReview, 1),
	}
	cand := make([]checker.Decided, len(base))
	copy(cand, base)
	for i := range cand {
		m := cand[i].Model
		rv := *m.Review
		m.Review = &rv
		cand[i].Model = m
	}
	cand[0].Model.Review.Owner = policy.OwnerContentSafety
	cand[1].Model.Review.Priority = "high"
	r, err := Compare(base, cand, Options{Baseline: policy.Default(), Candidate: policy.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Changed != 2 || r.ChangedTasks != 2 {
		t.Fatalf("changed %d decisions of %d tasks, want 2 of 2 (owner, priority)", r.Changed, r.ChangedTasks)
	}
	for _, c := range r.Changes {
		if c.Task == "same" {
			t.Errorf("the unchanged review item is counted as a change: %+v", c)
		}
	}
	loads := map[string]OwnerLoad{}
	for _, l := range r.Review {
		loads[l.Owner] = l
	}
	if loads[policy.OwnerAIProduct].Baseline != 3 || loads[policy.OwnerAIProduct].Candidate != 2 || loads[policy.OwnerContentSafety].Candidate != 1 {
		t.Errorf("review load %+v, want ai_product 3 -> 2, content_safety 0 -> 1", r.Review)
	}
}
