package router_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards "retries held behind a breaker come out in their due order once it
// closes" (docs/data-path.md, Breakers), as the checker's breaker.held_order
// check reads it: of the retries held behind one breaker, none is published
// after a retry that was due later. The default policy, breakers on, a
// router on a fake clock: 25 rate-limited tasks of acme/m1 (task IDs in the
// reverse of their due order) open its breaker and are held; when it
// half-opens, the earliest is its probe and the others are asked while the
// probe is out; a success closes it; a retry due after that asking but before
// the close waits for the retries held before it. The retry topic (one
// partition) must hold every retry in due order.
func TestHeldRetriesComeOutInDueOrderOnceTheBreakerCloses(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, t0)
	const cooldown = 30_000 // the default policy's provider/model cooldown

	rateLimited := func(taskID string, retryAfterMs int64) event.TaskEvent {
		return event.TaskEvent{
			EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.UnixMilli(t0)),
			Source: "held-test", Action: "answer_ticket", Provider: "acme", Model: "m1",
			Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &retryAfterMs},
		}
	}
	succeeded := func(taskID, provider, model string) event.TaskEvent {
		conf, valid := 0.95, true
		return event.TaskEvent{
			EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.UnixMilli(t0)),
			Source: "held-test", Action: "answer_ticket", Provider: provider, Model: model,
			Stage: event.StageModel, Status: event.StatusOK,
			Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf},
		}
	}

	// 25 failures open acme/m1 at t0 (20 requests, all failed); retry i is
	// due at t0 + 1000 + 10 i, and its task ID sorts before those due earlier
	var due []string // task IDs in due order
	for i := range 25 {
		id := fmt.Sprintf("held-%02d", 99-i)
		due = append(due, id)
		w.produce(rateLimited(id, 1000+10*int64(i)))
	}
	// and one more, due after the breaker half-opened and the others were
	// asked, before it closes
	late := "held-late"
	w.produce(rateLimited(late, cooldown+50))
	due = append(due, late)
	for _, id := range due {
		if d := w.waitAudit(id, 1)[0]; d.Route != event.RouteRetry {
			t.Fatalf("%s: %s/%s, want a RETRY", id, d.Class, d.Route)
		}
	}

	// the retries come due while acme/m1 is open: held
	w.clock.Store(t0 + 2000)
	for _, id := range due[:25] {
		if !expWaitFor(30*time.Second, func() bool {
			st := w.lastState(id)
			return st != nil && st.Pending != nil && st.Pending.NotBefore >= t0+cooldown
		}) {
			t.Fatalf("%s: not held behind the open breaker: %+v", id, w.lastState(id))
		}
	}
	if n := w.retryCount(); n != 0 {
		t.Fatalf("%d retries published into the open breaker", n)
	}

	// just past the cooldown: the breaker half-opens and lets one probe out
	w.clock.Store(t0 + cooldown + 2)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= 1 }) {
		t.Fatal("no probe when the breaker half-opened")
	}
	// a success closes it
	w.produce(succeeded("held-ok", "acme", "m1"))
	w.waitAudit("held-ok", 1)
	// the late retry comes due; a batch runs (its input is another model's)
	w.clock.Store(t0 + cooldown + 100)
	w.produce(succeeded("held-tick", "other", "m2"))
	w.waitAudit("held-tick", 1)
	// long after: everything held has come out
	w.clock.Store(t0 + 2*cooldown)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= len(due) }) {
		t.Fatalf("%d of %d retries published", w.retryCount(), len(due))
	}

	got := w.retryTasks()
	if !slices.Equal(got, due) {
		t.Fatalf("retries on the retry topic in this order:\n  %v\nwant their due order:\n  %v", got, due)
	}
}

// Guards "retries held behind a breaker come out in their due order once it
// closes" when a person resets breakers (faultrouter breaker reset) and a
// retry is held behind two: the default policy, breakers on, a router on a
// fake clock. acme/m1 opens, then the downstream refund; a retry of both is
// due after refund's reset, so behind acme/m1 alone: it must come out with
// acme/m1's retries, in due order, when acme/m1 is reset, not wait for what
// was held behind refund. Each reset releases its retries at once, not at
// the end of the cooldown.
func TestHeldRetriesComeOutInDueOrderAfterResets(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, t0)
	const cooldown = 30_000 // the default policy's provider/model and downstream cooldown

	rateLimited := func(taskID, provider, action string, stage event.Stage, decidedAt, due int64) event.TaskEvent {
		after := due - decidedAt
		return event.TaskEvent{
			EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.UnixMilli(decidedAt)),
			Source: "held-test", Action: action, Provider: provider, Model: "m1",
			Stage: stage, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &after},
		}
	}
	resets := 0
	reset := func(sc breaker.Scope, key string) {
		t.Helper()
		if _, err := control.ResetBreaker(context.Background(), w.seeds, w.codec, control.Topics{Decisions: w.topics.Decisions, Breakers: w.topics.Breakers},
			control.Reset{Scope: sc, Key: key, Reason: "test", Operator: "held-test"}); err != nil {
			t.Fatal(err)
		}
		resets++
		if !expWaitFor(30*time.Second, func() bool { return w.auditedRule("breaker.reset") >= resets }) {
			t.Fatalf("reset of %s %s not audited", sc, key)
		}
	}
	held := func(ids []string, notBefore int64) {
		t.Helper()
		for _, id := range ids {
			if !expWaitFor(30*time.Second, func() bool {
				st := w.lastState(id)
				return st != nil && st.Pending != nil && st.Pending.NotBefore >= notBefore
			}) {
				for _, r := range w.retryRecords() {
					t.Logf("retry %s at t0%+d", r.Event.TaskID, r.Decision.DecidedAt.UnixMilli()-t0)
				}
				t.Fatalf("%s: not held: %+v", id, w.lastState(id))
			}
		}
	}

	// acme/m1 opens at t0 (20 failures), its retries due t0 + 1000 + 10 i;
	// one more due at t0 + 15000
	var pm []string
	for i := range 20 {
		id := fmt.Sprintf("pm-%02d", 99-i)
		pm = append(pm, id)
		w.produce(rateLimited(id, "acme", "answer_ticket", event.StageNetwork, t0, t0+1000+10*int64(i)))
	}
	w.produce(rateLimited("pm-late", "acme", "answer_ticket", event.StageNetwork, t0, t0+15_000))
	for _, id := range append(slices.Clone(pm), "pm-late") {
		w.waitAudit(id, 1)
	}
	// five seconds on the downstream refund opens (20 business failures of
	// another model), its retries due t0 + 6000 + 10 i; a retry of acme/m1
	// and refund is due at t0 + 14000
	w.clock.Store(t0 + 5000)
	var ds []string
	for i := range 20 {
		id := fmt.Sprintf("ds-%02d", 99-i)
		ds = append(ds, id)
		w.produce(rateLimited(id, "zed", "refund", event.StageBusiness, t0+5000, t0+6000+10*int64(i)))
	}
	w.produce(rateLimited("both", "acme", "refund", event.StageNetwork, t0+5000, t0+14_000))
	for _, id := range append(slices.Clone(pm), append(ds, "pm-late", "both")...) {
		if d := w.waitAudit(id, 1)[0]; d.Route != event.RouteRetry {
			t.Fatalf("%s: %s/%s, want a RETRY", id, d.Class, d.Route)
		}
	}

	w.clock.Store(t0 + 10_000)
	held(pm, t0+cooldown)
	held(ds, t0+5000+cooldown)
	w.clock.Store(t0 + 12_000)
	reset(breaker.Downstream, "refund")
	// refund's retries come out at its reset, once the breakers table that
	// read the reset is fresh (their publication may wait for it)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= len(ds) }) {
		t.Fatalf("%d of refund's %d retries published at its reset", w.retryCount(), len(ds))
	}
	w.clock.Store(t0 + 16_000)
	held([]string{"both", "pm-late"}, t0+cooldown)
	w.clock.Store(t0 + 20_000)
	reset(breaker.ProviderModel, "acme/m1")
	want := append(append(append([]string{}, ds...), pm...), "both", "pm-late")
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= len(want) }) {
		t.Fatalf("%d of %d retries published", w.retryCount(), len(want))
	}
	if got := w.retryTasks(); !slices.Equal(got, want) {
		t.Fatalf("retries on the retry topic in this order:\n  %v\nwant refund's at its reset, then acme/m1's at its reset, each in due order:\n  %v", got, want)
	}
	// and each at its reset, not at the end of a cooldown
	for _, r := range w.retryRecords() {
		at, id := r.Decision.DecidedAt.UnixMilli(), r.Event.TaskID
		if slices.Contains(ds, id) && at != t0+12_000 || !slices.Contains(ds, id) && at != t0+20_000 {
			t.Errorf("retry of %s published at t0%+d ms, want at the reset of its breaker", id, at-t0)
		}
	}
}

// Guards "a retry is not published before its due time" for a retry held as
// soon as it is decided, because its breaker is open past its due time (the
// router writes it once, moved to the end of the cooldown, instead of holding
// it when it comes due): the default policy, breakers on, a router on a fake
// clock. acme/m1 opens at t0; a retry due at t0 + 10 s is decided while it is
// open; a person resets acme/m1 at t0 + 5 s. The retries that were due come
// out at the reset; that one must wait for its own due time, and come out
// then, not at the end of the cooldown.
func TestRetryHeldAheadWaitsForItsDueTimeAfterAReset(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	w := expStart(t, t0)
	const cooldown = 30_000 // the default policy's provider/model cooldown
	rateLimited := func(taskID, model string, due int64) event.TaskEvent {
		after := due - t0
		return event.TaskEvent{
			EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.UnixMilli(t0)),
			Source: "held-test", Action: "answer_ticket", Provider: "acme", Model: model,
			Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &after},
		}
	}

	// 20 failures open acme/m1 at t0, their retries due t0 + 1000 + 10 i;
	// then a retry due at t0 + 10 s is decided while it is open
	var due []string
	for i := range 20 {
		id := fmt.Sprintf("held-%02d", i)
		due = append(due, id)
		w.produce(rateLimited(id, "m1", t0+1000+10*int64(i)))
	}
	w.produce(rateLimited("ahead", "m1", t0+10_000))
	for _, id := range append(slices.Clone(due), "ahead") {
		if d := w.waitAudit(id, 1)[0]; d.Route != event.RouteRetry {
			t.Fatalf("%s: %s/%s, want a RETRY", id, d.Class, d.Route)
		}
	}
	w.clock.Store(t0 + 5000)
	for _, id := range append(slices.Clone(due), "ahead") {
		if !expWaitFor(30*time.Second, func() bool {
			st := w.lastState(id)
			return st != nil && st.Pending != nil && st.Pending.NotBefore >= t0+cooldown
		}) {
			t.Fatalf("%s: not held behind the open breaker: %+v", id, w.lastState(id))
		}
	}
	if n := w.retryCount(); n != 0 {
		t.Fatalf("%d retries published into the open breaker", n)
	}
	// the retry held as it was decided says so on its decision line, with
	// its own due time, and has no line of its own
	due10 := time.UnixMilli(t0 + 10_000).Format("2006-01-02T15:04:05.000Z07:00")
	if got := w.logs.lines("msg=routed", "task_id=ahead ", `held="breaker open"`, "due="+due10); len(got) != 1 {
		t.Fatalf("decision lines of ahead that say it is held until %s: %d, want 1; its lines:\n%s", due10, len(got), strings.Join(w.logs.lines("task_id=ahead "), ""))
	}
	if got := w.logs.lines("task_id=ahead ", "held"); len(got) != 1 {
		t.Fatalf("lines of ahead that speak of its hold: %d, want its decision line alone:\n%s", len(got), strings.Join(got, ""))
	}

	// the reset releases the retries that were due
	if _, err := control.ResetBreaker(context.Background(), w.seeds, w.codec, control.Topics{Decisions: w.topics.Decisions, Breakers: w.topics.Breakers},
		control.Reset{Scope: breaker.ProviderModel, Key: "acme/m1", Reason: "test", Operator: "held-test"}); err != nil {
		t.Fatal(err)
	}
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= len(due) }) {
		t.Fatalf("%d of %d due retries published after the reset", w.retryCount(), len(due))
	}
	// a batch more, on another model, still before the retry is due
	w.produce(rateLimited("tick", "m2", t0+60_000))
	w.waitAudit("tick", 1)
	if got := w.retryTasks(); !slices.Equal(got, due) {
		t.Fatalf("retries on the retry topic at t0 + 5 s, after the reset:\n  %v\nwant the ones that were due:\n  %v", got, due)
	}

	// at its own due time it comes out
	w.clock.Store(t0 + 10_000)
	if !expWaitFor(30*time.Second, func() bool { return w.retryCount() >= len(due)+1 }) {
		t.Fatalf("the retry held ahead was not published at its due time: %+v", w.lastState("ahead"))
	}
	r := w.retryRecords()[len(due)]
	if r.Event.TaskID != "ahead" || r.Decision.DecidedAt.UnixMilli() != t0+10_000 || r.Decision.Retry.NotBefore.UnixMilli() != t0+10_000 {
		t.Fatalf("retry of %s decided at t0%+d ms, not before t0%+d ms; want ahead at t0+10000, its due time",
			r.Event.TaskID, r.Decision.DecidedAt.UnixMilli()-t0, r.Decision.Retry.NotBefore.UnixMilli()-t0)
	}
}

// auditedRule counts the audit records with a decision of rule.
func (w *expWorld) auditedRule(rule string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.audit {
		if r.Decision.Rule == rule {
			n++
		}
	}
	return n
}

// retryRecords are the retry topic's records, in offset order.
func (w *expWorld) retryRecords() []event.Routed {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.retries)
}

// retryCount is how many retries the retry topic holds.
func (w *expWorld) retryCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.retries)
}

// retryTasks are the task IDs of the retry topic's records, in offset order.
func (w *expWorld) retryTasks() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []string
	for _, r := range w.retries {
		if r.Event != nil {
			ids = append(ids, r.Event.TaskID)
		}
	}
	return ids
}
