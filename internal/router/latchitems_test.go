package router

import (
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// hallucinate routes a MODEL_HALLUCINATION of template tpl for the task
// through observe, in its own committed batch, and returns the batch.
func hallucinate(t *testing.T, r *Router, id, tpl string, now time.Time) *batch {
	t.Helper()
	b := newBatch()
	r.brk.begin(r.cfg.Now())
	ev := event.TaskEvent{TaskID: id, PromptTemplate: tpl, Provider: "p", Model: "m", Action: "refund", Stage: event.StageModel}
	in := input{kind: inputTask, event: ev,
		decision: event.Decision{Class: event.ClassHallucination, Route: event.RouteQuarantine, Reason: "fabricated_data"}}
	r.brk.observe(&in, b, now)
	r.brk.commit()
	return b
}

// decideItem routes a reviewer's decision of the task's hallucination item
// through observe, in its own batch, committed or not.
func decideItem(t *testing.T, r *Router, id, tpl string, now time.Time, commit bool) *batch {
	t.Helper()
	b := newBatch()
	r.brk.begin(r.cfg.Now())
	b.states[id] = &task.State{TaskID: id, LastEvent: &event.TaskEvent{TaskID: id, PromptTemplate: tpl}}
	in := input{kind: inputReview, review: event.ReviewDecision{TaskID: id, Reason: "checked", Reviewer: "ana"},
		decision: event.Decision{Class: event.ClassHallucination, Route: event.RouteComplete}, state: b.states[id]}
	r.brk.observe(&in, b, now)
	if commit {
		r.brk.commit()
	} else {
		r.brk.rollback()
	}
	return b
}

// itemRecords counts the latch item records (open) and tombstones of a batch.
func itemRecords(b *batch) (open, decided int) {
	for _, rec := range b.out {
		if rec.Topic != "breakers" || len(rec.Key) < len(event.BreakerItemPrefix) || string(rec.Key[:len(event.BreakerItemPrefix)]) != event.BreakerItemPrefix {
			continue
		}
		if rec.Value == nil {
			decided++
		} else {
			open++
		}
	}
	return open, decided
}

// Guards the latch rule of hallucinations: a prompt template latched by two
// hallucinations stays latched (no transition, no RESET command) when the
// first item is decided, whatever the decision; it reopens when the second
// is decided. Each item opens and closes with a record on the breakers
// topic, so other instances count it too; a decision whose batch does not
// commit changes nothing.
func TestTemplateStaysLatchedUntilEveryItemIsDecided(t *testing.T) {
	r := adoptRouter(t)
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	r.cfg.Now = func() time.Time { return t0 }

	if b := hallucinate(t, r, "h-1", "tpl", t0); !r.brk.set.Latched(ref) {
		t.Fatal("a hallucination did not latch its template")
	} else if open, _ := itemRecords(b); open != 1 {
		t.Fatalf("the first hallucination wrote %d latch item records, want 1", open)
	}
	if b := hallucinate(t, r, "h-2", "tpl", t0.Add(time.Second)); len(r.brk.events) != 1 {
		t.Fatalf("the second hallucination queued %+v, want only its alert (the template is latched already)", r.brk.events)
	} else if open, _ := itemRecords(b); open != 1 {
		t.Fatalf("the second hallucination wrote %d latch item records, want 1", open)
	}

	// a decision whose transaction does not commit is undone
	decideItem(t, r, "h-1", "tpl", t0.Add(2*time.Second), false)
	if got := r.brk.items.holding(ref, ""); len(got) != 2 {
		t.Fatalf("after a decision that did not commit, open items %v, want h-1 and h-2", got)
	}

	b := decideItem(t, r, "h-1", "tpl", t0.Add(3*time.Second), true)
	if !r.brk.set.Latched(ref) {
		t.Fatal("deciding the first of two items reopened the template")
	}
	if len(r.brk.events) != 0 {
		t.Fatalf("deciding the first of two items queued %+v, want no transition", r.brk.events)
	}
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("deciding an item wrote %d tombstones, want 1", decided)
	}
	for _, rec := range b.out {
		if rec.Topic == "decisions" {
			t.Fatalf("deciding the first of two items wrote a command to decisions: %s", rec.Key)
		}
	}

	b = decideItem(t, r, "h-2", "tpl", t0.Add(4*time.Second), true)
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatalf("deciding the last item left the template %s, want CLOSED", r.brk.set.State(ref))
	}
	if len(r.brk.events) != 1 || r.brk.events[0].To != breaker.Closed.String() || r.brk.events[0].TaskID != "h-2" {
		t.Fatalf("deciding the last item queued %+v, want one CLOSED transition naming h-2", r.brk.events)
	}
}

// Guards that the latch items come from every instance and that a reset by
// hand releases them: an item another instance opened (read from the
// breakers topic) keeps the template latched when this instance decides its
// own; a RESET command closes the template and writes the tombstones of the
// items open when it was made, so that a later latch is held only by its own
// items.
func TestOtherInstancesItemsHoldAndAResetReleasesThem(t *testing.T) {
	r := adoptRouter(t)
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	r.cfg.Now = func() time.Time { return t0 }

	hallucinate(t, r, "h-1", "tpl", t0)
	r.brk.items.adopt(event.BreakerItemKey(breaker.PromptTemplate.String(), "tpl", "h-9"), &latchItem{ref: ref, task: "h-9", openedAt: t0.UnixMilli()})
	decideItem(t, r, "h-1", "tpl", t0.Add(time.Second), true)
	if !r.brk.set.Latched(ref) {
		t.Fatal("deciding this instance's item reopened the template while another instance's item h-9 is open")
	}

	b := newBatch()
	r.brk.begin(r.cfg.Now())
	cmd := input{kind: inputCommand, command: event.BreakerEvent{Scope: breaker.PromptTemplate.String(), Key: "tpl", Kind: event.BreakerKindReset,
		Reason: "prompt fixed", Instance: "ops", At: event.At(t0.Add(2 * time.Second))}}
	r.brk.command(&cmd, b, t0.Add(2*time.Second))
	r.brk.commit()
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatal("a reset by hand did not close the template")
	}
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("the reset wrote %d tombstones, want 1 (h-9)", decided)
	}

	hallucinate(t, r, "h-3", "tpl", t0.Add(3*time.Second))
	decideItem(t, r, "h-3", "tpl", t0.Add(4*time.Second), true)
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatal("an item released by the reset kept a later latch")
	}
}

// Guards that an item a re-drive cleared no longer holds its template: an
// operator re-drives the task of one of two hallucinations (its review item
// is gone, so no one can decide it); its item is tombstoned without
// reopening the template, and the decision of the other item reopens it.
func TestRedriveReleasesTheTasksLatchItem(t *testing.T) {
	r := adoptRouter(t)
	ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	r.cfg.Now = func() time.Time { return t0 }
	hallucinate(t, r, "h-1", "tpl", t0)
	hallucinate(t, r, "h-2", "tpl", t0.Add(time.Second))

	b := newBatch()
	r.brk.begin(r.cfg.Now())
	ev := event.TaskEvent{TaskID: "h-1", PromptTemplate: "tpl", Provider: "p", Model: "m", Action: "refund", Stage: event.StageModel}
	b.states["h-1"] = &task.State{TaskID: "h-1", LastEvent: &ev} // reopened: no review item
	in := input{kind: inputTask, event: ev, decision: event.Decision{Class: event.ClassSucceeded, Route: event.RouteComplete}, state: b.states["h-1"]}
	r.brk.observe(&in, b, t0.Add(2*time.Second))
	r.brk.commit()
	if _, decided := itemRecords(b); decided != 1 {
		t.Fatalf("the re-driven task's event wrote %d tombstones, want 1", decided)
	}
	if !r.brk.set.Latched(ref) {
		t.Fatal("releasing a re-driven task's item reopened the template")
	}
	decideItem(t, r, "h-2", "tpl", t0.Add(3*time.Second), true)
	if r.brk.set.State(ref) != breaker.Closed {
		t.Fatal("the decision of the last item held did not reopen the template")
	}
}
