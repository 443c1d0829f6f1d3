package hold

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
// sweep, are each moved to their breaker's time and keep their own due times,
// which order them in the due index (not their task IDs).
func TestHeldRetriesKeepDueOrderAcrossBreakers(t *testing.T) {
	brk, err := New(policy.Default(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_800_000_000_000)
	tmpl := breaker.Ref{Scope: breaker.PromptTemplate, Key: "refund-v9"}
	model := breaker.Ref{Scope: breaker.ProviderModel, Key: "openai/gpt-4o"}
	brk.set.Trip(tmpl, "hallucination", breaker.Outcome{}, now)
	brk.set.Trip(model, "test", breaker.Outcome{}, now)

	b := newTestBatch()
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
		brk.postpone(b.states[ev.TaskID], policy.BreakerRefs(ev), 0, now)
	}
	z, m, a := b.states["t-z"].Pending, b.states["t-m"].Pending, b.states["t-a"].Pending
	if z.NotBefore <= now.UnixMilli() || m.NotBefore <= now.UnixMilli() {
		t.Fatalf("held retries not moved past now: t-z %d, t-m %d, now %d", z.NotBefore, m.NotBefore, now.UnixMilli())
	}
	if z.NotBefore != a.NotBefore {
		t.Fatalf("t-z and t-a, held behind the same breaker, are asked again at %d and %d, want together", z.NotBefore, a.NotBefore)
	}
	if z.Due() != due || m.Due() != due+1 || a.Due() != due+2 {
		t.Fatalf("own due times t-z %d, t-m %d, t-a %d; want %d, %d, %d", z.Due(), m.Due(), a.Due(), due, due+1, due+2)
	}
}
