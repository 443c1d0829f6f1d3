package router

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Guards "retries held behind a breaker come out in their due order": held
// retries of two breakers with different hold times, asked in turn in one
// sweep, each keep the order of their own due times, whatever their task IDs
// (the due index breaks equal times by task ID).
func TestHeldRetriesKeepDueOrderAcrossBreakers(t *testing.T) {
	brk, err := newBreakers(policy.Default(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r := &Router{brk: brk}
	now := time.UnixMilli(1_800_000_000_000)
	tmpl := breaker.Ref{Scope: breaker.PromptTemplate, Key: "refund-v9"}
	model := breaker.Ref{Scope: breaker.ProviderModel, Key: "openai/gpt-4o"}
	brk.set.Trip(tmpl, "hallucination", breaker.Outcome{}, now)
	brk.set.Trip(model, "test", breaker.Outcome{}, now)

	b := newBatch()
	held := func(id, template, provider, model string, due int64) *event.TaskEvent {
		ev := &event.TaskEvent{TaskID: id, PromptTemplate: template, Provider: provider, Model: model}
		b.states[id] = &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: due}}
		return ev
	}
	due := now.UnixMilli() - 100
	// due order: t-z (template), t-m (model), t-a (template)
	evs := []*event.TaskEvent{
		held("t-z", "refund-v9", "", "", due),
		held("t-m", "", "openai", "gpt-4o", due+1),
		held("t-a", "refund-v9", "", "", due+2),
	}
	for _, ev := range evs {
		r.postpone(ev, b, now)
	}
	z, a := b.states["t-z"].Pending.NotBefore, b.states["t-a"].Pending.NotBefore
	if z <= now.UnixMilli() || a <= now.UnixMilli() {
		t.Fatalf("held retries not moved past now: t-z %d, t-a %d, now %d", z, a, now.UnixMilli())
	}
	if z >= a {
		t.Fatalf("t-z was due before t-a behind the same breaker, but now comes due at %d, not before t-a at %d", z, a)
	}
}
