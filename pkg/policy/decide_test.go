package policy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

func timeoutEvent(id string, attempt int32, at time.Time) *event.TaskEvent {
	return &event.TaskEvent{
		EventID: id, TaskID: "T-1", Attempt: attempt, OccurredAt: event.At(at),
		Stage: event.StageNetwork, Status: event.StatusError,
		Error:      &event.Error{Type: "TimeoutError"},
		Usage:      event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100},
		Attributes: map[string]string{"k": "v"},
	}
}

// TestGoldenCoversEveryClass guards the golden files' coverage: the golden cases hold at
// least one decision of every class of docs/design.md (all but INVALID_INPUT,
// which never reaches the policy) and every route.
func TestGoldenCoversEveryClass(t *testing.T) {
	files, _ := filepath.Glob("testdata/cases/*.json")
	classes, routes := map[event.Class]bool{}, map[event.Route]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c goldenCase
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&c); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, s := range c.Steps {
			classes[s.Expect.Class], routes[s.Expect.Route] = true, true
		}
	}
	for _, c := range event.Classes {
		if c != event.ClassInvalidInput && !classes[c] {
			t.Errorf("no golden case decides class %s", c)
		}
	}
	for _, r := range event.Routes {
		if !routes[r] {
			t.Errorf("no golden case routes %s", r)
		}
	}
}

// TestDecideState guards Decide's state contract: a new task gets its ID and
// the policy SLA, an event's sla_ms wins, totals and LastEvent follow the
// event, and LastEvent is a copy the caller's later changes cannot touch.
func TestDecideState(t *testing.T) {
	p := Default()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var st task.State
	ev := timeoutEvent("e1", 1, now.Add(-time.Second))
	d := p.Decide(ev, &st, now)
	if st.TaskID != "T-1" || st.SLAMs != p.DefaultSLAMs || !st.Seen("e1") {
		t.Errorf("new task state: %+v", st)
	}
	if d.Totals != st.Totals() || d.Totals.Attempts != 1 || d.Totals.Retries != 1 {
		t.Errorf("totals %+v, state %+v", d.Totals, st.Totals())
	}
	if st.Pending == nil || st.Pending.NotBefore != now.Add(time.Second).UnixMilli() || st.LastSeenAt != now.UnixMilli() || st.LastEventAt != ev.OccurredAt.Millis() {
		t.Errorf("pending %+v, last seen %d, last event %d", st.Pending, st.LastSeenAt, st.LastEventAt)
	}
	ev.Error.Type, ev.Attributes["k"] = "changed", "changed"
	if st.LastEvent.Error.Type != "TimeoutError" || st.LastEvent.Attributes["k"] != "v" {
		t.Error("the state's LastEvent aliases the caller's event")
	}

	sla := int64(5000)
	ev2 := timeoutEvent("e2", 2, now)
	ev2.SLAMs = &sla
	p.Decide(ev2, &st, now)
	if st.SLAMs != 5000 {
		t.Errorf("event sla_ms did not win: %d", st.SLAMs)
	}
}

// TestDropChangesNothing guards dedup: an exact redelivery is DROP and the
// task state is untouched.
func TestDropChangesNothing(t *testing.T) {
	p := Default()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var st task.State
	ev := timeoutEvent("e1", 1, now)
	p.Decide(ev, &st, now)
	before := cloneState(t, &st)
	d := p.Drop(ev, &st, now.Add(time.Minute))
	if d.Route != event.RouteDrop || d.Retry != nil || d.Totals != st.Totals() {
		t.Errorf("Drop = %+v", d)
	}
	if !reflect.DeepEqual(before, &st) {
		t.Error("Drop changed the state")
	}
}

// TestReviewWithoutOpenItem guards the review loop-back: a decision for an unknown
// task or an item already closed is audited (DROP) and changes nothing.
func TestReviewWithoutOpenItem(t *testing.T) {
	p := Default()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rd := &event.ReviewDecision{TaskID: "T-1", Approve: true, Reason: "ok", At: event.At(now)}

	var fresh task.State
	if d := p.DecideReview(rd, &fresh, now); d.Route != event.RouteDrop || d.Rule != RuleNoOpenItem {
		t.Errorf("unknown task: %+v", d)
	}
	if !reflect.DeepEqual(fresh, task.State{}) {
		t.Errorf("unknown task got state %+v", fresh)
	}

	var st task.State
	p.Decide(timeoutEvent("e1", 1, now), &st, now) // a retry: no review item
	for _, review := range []string{task.ReviewNone, task.ReviewApproved, task.ReviewRejected, task.ReviewResolved} {
		st.Review = review
		before := cloneState(t, &st)
		d := p.DecideReview(rd, &st, now)
		if d.Route != event.RouteDrop || d.Rule != RuleNoOpenItem || d.Retry != nil {
			t.Errorf("review %q: %+v", review, d)
		}
		if !reflect.DeepEqual(before, &st) {
			t.Errorf("review %q: the state changed", review)
		}
	}
}

// TestApproveGrantsOneRetry guards the approve choice: the approved retry is
// counted in the totals but under no limit, and the next failure meets the
// limits as they stand (here the exhausted shared budget: dead letter).
func TestApproveGrantsOneRetry(t *testing.T) {
	p := Default()
	p.RetryBudget = 1
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var st task.State
	auth := func(id string, n int32) *event.TaskEvent {
		ev := timeoutEvent(id, n, now)
		ev.Error = &event.Error{HTTPStatus: 401}
		return ev
	}
	if d := p.Decide(auth("a1", 1), &st, now); d.Route != event.RouteRetry {
		t.Fatalf("first auth failure: %+v", d)
	}
	if d := p.Decide(auth("a2", 2), &st, now); d.Route != event.RouteReview {
		t.Fatalf("second auth failure: %+v", d)
	}
	d := p.DecideReview(&event.ReviewDecision{TaskID: "T-1", Approve: true, Reason: "key rotated", At: event.At(now)}, &st, now)
	if d.Route != event.RouteRetry || d.Retry.N != 2 || d.Retry.DelayMs != 0 || d.Totals.Retries != 2 || st.Terminal {
		t.Fatalf("approve over an exhausted budget: %+v, state %+v", d, st)
	}
	if st.RetriesByClass[event.ClassAuthFailed] != 1 {
		t.Errorf("the approved retry counted in a class: %v", st.RetriesByClass)
	}
	ev := timeoutEvent("a3", 3, now.Add(time.Minute))
	if d := p.Decide(ev, &st, now); d.Route != event.RouteDeadLetter || d.Rule != "budget.retries_exhausted" {
		t.Errorf("failure after the approved retry: %+v", d)
	}
}

// TestExplainIsDecideOnFreshState guards `policy explain`: Explain gives the
// decision Decide gives for a new task.
func TestExplainIsDecideOnFreshState(t *testing.T) {
	p := Default()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := timeoutEvent("e1", 1, now)
	var st task.State
	if got, want := p.Explain(ev, now), p.Decide(ev, &st, now); !reflect.DeepEqual(got, want) {
		t.Errorf("Explain = %+v, Decide = %+v", got, want)
	}
}

func cloneState(t *testing.T, st *task.State) *task.State {
	t.Helper()
	b, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	c, err := task.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRetryAfterCeiling guards the rate-limit ceiling: a 429 whose
// retry_after_ms exceeds rate_limited.max_retry_after_ms is retried after the
// ceiling, and a retry_after_ms so large that it overflows a time.Duration
// (about 292 years) still yields a retry due after the decision, never one in
// the past.
func TestRetryAfterCeiling(t *testing.T) {
	p := Default()
	now := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, ra := range []int64{p.RateLimited.MaxRetryAfterMs + 1, 10 * 365 * 24 * 3_600_000, 1 << 62} {
		ev := &event.TaskEvent{
			EventID: "e-429", TaskID: "T-429", Attempt: 1, OccurredAt: event.At(now),
			Stage: event.StageModel, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", RetryAfterMs: &ra},
		}
		st := &task.State{}
		d := p.Decide(ev, st, now)
		if d.Class != event.ClassRateLimited || d.Route != event.RouteRetry || d.Retry == nil {
			t.Fatalf("retry_after_ms %d: %s/%s retry %+v, want RATE_LIMITED/RETRY", ra, d.Class, d.Route, d.Retry)
		}
		want := now.Add(time.Duration(p.RateLimited.MaxRetryAfterMs) * time.Millisecond)
		if d.Retry.DelayMs != p.RateLimited.MaxRetryAfterMs || !d.Retry.NotBefore.Time.Equal(want) {
			t.Errorf("retry_after_ms %d: delay %d ms, not before %s; want the ceiling %d ms, %s",
				ra, d.Retry.DelayMs, d.Retry.NotBefore.Time, p.RateLimited.MaxRetryAfterMs, want)
		}
		if st.Pending == nil || st.Pending.NotBefore != want.UnixMilli() {
			t.Errorf("retry_after_ms %d: pending %+v, want not before %d", ra, st.Pending, want.UnixMilli())
		}
	}
}

// TestReviewReconcilesAnUnknownWrite guards a reviewer's decision on an
// OUTCOME_UNKNOWN item as the held write's reconciliation: a reject closes
// the write (RECONCILED: no longer unknown, a new submission of it is a
// duplicate execution, a receipt still counts); an approve takes it as not
// executed (PLANNED) and retries it, and the retry's unknown outcome is held
// again.
func TestReviewReconcilesAnUnknownWrite(t *testing.T) {
	p := Default()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	write := func(id string, n int32, state event.OpState) *event.TaskEvent {
		ev := timeoutEvent(id, n, now)
		ev.Stage, ev.Action = event.StageBusiness, "refund"
		ev.Operation = &event.Operation{OpID: "op-1", Kind: event.OpWrite, ParamsSHA256: "ab", State: state}
		if state == event.OpConfirmed || state == event.OpRejected {
			ev.Error = nil
			ev.Status = event.StatusOK
		}
		return ev
	}
	unknown := func(st *task.State) bool { return st.Op("op-1").Unknown() }

	var rej task.State
	if d := p.Decide(write("w1", 1, event.OpUnknown), &rej, now); d.Class != event.ClassOutcomeUnknown || !unknown(&rej) {
		t.Fatalf("unknown write: %+v", d)
	}
	d := p.DecideReview(&event.ReviewDecision{TaskID: "T-1", Reason: "the refund went out", At: event.At(now)}, &rej, now)
	if d.Route != event.RouteComplete || rej.Op("op-1").State != task.OpReconciled || !strings.Contains(d.Reason, "op-1 closed by the reviewer") {
		t.Fatalf("reject: %+v, operation %+v", d, rej.Op("op-1"))
	}
	if d := p.Decide(write("w2", 2, event.OpSubmitted), &rej, now); d.Class != event.ClassDuplicateExecution || rej.Op("op-1").State != task.OpReconciled {
		t.Errorf("a new submission of the reconciled write: %s/%s (%s), operation %+v; want DUPLICATE_EXECUTION, still RECONCILED", d.Class, d.Route, d.Rule, rej.Op("op-1"))
	}
	if d := p.Decide(write("w3", 3, event.OpRejected), &rej, now); d.Rule != "outcome_unknown.rejected" || rej.Op("op-1").State != event.OpRejected {
		t.Errorf("a receipt for the reconciled write: rule %s, operation %+v; want outcome_unknown.rejected, REJECTED", d.Rule, rej.Op("op-1"))
	}

	var app task.State
	p.Decide(write("w1", 1, event.OpUnknown), &app, now)
	d = p.DecideReview(&event.ReviewDecision{TaskID: "T-1", Approve: true, Reason: "never reached the bank", At: event.At(now)}, &app, now)
	if d.Route != event.RouteRetry || app.Op("op-1").State != event.OpPlanned || unknown(&app) {
		t.Fatalf("approve: %+v, operation %+v", d, app.Op("op-1"))
	}
	if d := p.Decide(write("w2", 2, event.OpUnknown), &app, now); d.Class != event.ClassOutcomeUnknown || !unknown(&app) {
		t.Errorf("the retried write's unknown outcome: %s/%s, operation %+v; want OUTCOME_UNKNOWN, held again", d.Class, d.Route, app.Op("op-1"))
	}
}
