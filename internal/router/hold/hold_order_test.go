package hold

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
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

// mapLoader is a store of task states held in a map (StateLoader).
type mapLoader map[string]*task.State

func (m mapLoader) Load(ids []string, _ func(string) int32, into map[string]*task.State) error {
	for _, id := range ids {
		if st, ok := m[id]; ok {
			into[id] = st
		}
	}
	return nil
}

// Guards "retries held behind a breaker come out in their due order once it
// closes" when the time a held retry was moved to has come before the
// close: the sweep reads a bounded number of due entries a batch, so a
// retry left to it could come out a batch after retries released at the
// close that were due after it (TestChecker, seed 729419726, reported one
// such retry). Every retry held behind the closed breaker is released at
// the close, in due order, and one whose time has come keeps it.
func TestAClosedBreakerReleasesARetryWhoseTimeHasCome(t *testing.T) {
	k := adoptBreakers(t)
	now := time.UnixMilli(1_800_000_000_000)
	nowMs := now.UnixMilli()
	m := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
	k.set.Trip(m, "test", breaker.Outcome{}, now.Add(-time.Minute))
	stored := mapLoader{
		// due first; moved to a time that has passed (its entry is among
		// those the sweep may not reach this batch)
		"t-early": {TaskID: "t-early", Pending: &task.PendingRetry{N: 1, DueAt: nowMs - 600, NotBefore: nowMs - 20}},
		// due after it; moved to a time still to come
		"t-late": {TaskID: "t-late", Pending: &task.PendingRetry{N: 1, DueAt: nowMs - 300, NotBefore: nowMs + 5_000}},
	}
	k.store = stored
	for _, id := range []string{"t-late", "t-early"} {
		k.held.put(id, 0, []breaker.Ref{m})
	}
	b := newTestBatch()
	k.transitionEvents(k.set.Reset(m, "a person reset it", now), b)

	var released []string
	load := func(st *task.State, _ int32) {
		released = append(released, st.TaskID)
		b.states[st.TaskID] = st
	}
	if err := k.ReleaseHeld(b.states, load, now); err != nil {
		t.Fatal(err)
	}
	if want := []string{"t-early", "t-late"}; !slices.Equal(released, want) {
		t.Fatalf("released %v at the close, want %v (every retry held behind it, in due order)", released, want)
	}
	if nb := b.states["t-early"].Pending.NotBefore; nb != nowMs-20 {
		t.Fatalf("t-early's time moved from %d to %d: it had come", nowMs-20, nb)
	}
	if nb := b.states["t-late"].Pending.NotBefore; nb != nowMs {
		t.Fatalf("t-late not due at the close: not before %d, now %d", nb, nowMs)
	}
}

// A held retry's line names the breaker it waits for and its state: an
// operator reading why a retry is not out sees which breaker to look at.
func TestAHeldRetrysLineNamesItsBreaker(t *testing.T) {
	brk, err := New(policy.Default(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	brk.log = slog.New(slog.NewTextHandler(&logs, nil))
	now := time.UnixMilli(1_800_000_000_000)
	model := breaker.Ref{Scope: breaker.ProviderModel, Key: "openai/gpt-4o"}
	brk.set.Trip(model, "test", breaker.Outcome{}, now) // tripped by hand: latched until a reset
	b := newTestBatch()
	ev := &event.TaskEvent{TaskID: "t-held", PromptTemplate: "refund-v9", Provider: "openai", Model: "gpt-4o"}
	st := &task.State{TaskID: "t-held", Pending: &task.PendingRetry{N: 1, NotBefore: now.UnixMilli()}}
	if !brk.HoldRetry(ev, st, 0, b, now) {
		t.Fatal("a retry whose provider/model breaker is OPEN was not held")
	}
	if got := logs.String(); !strings.Contains(got, `msg="retry held: breaker open"`) || !strings.Contains(got, `breaker="PROVIDER_MODEL/openai/gpt-4o (OPEN, latched)"`) {
		t.Fatalf("the held retry's line does not name its breaker and state:\n%s", got)
	}
}
