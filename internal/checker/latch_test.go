package checker

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// latchRun writes the logs of two hallucinations of template tpl (tasks h-1
// and h-2) and reviewers' rejections of both items, with a router's correct
// outputs (their items and tombstones on the breakers topic) except the
// template's transitions: the hallucination of h-1 latches it (OPEN,
// latched), and the template reopens (CLOSED) at the decision of h-1 when
// reopenEarly, else at the decision of h-2.
func latchRun(t *testing.T, reopenEarly bool) *Report {
	b := newLog(t)
	p := policy.Default()
	halluc := func(task, id string, at time.Time) event.TaskEvent {
		return event.TaskEvent{EventID: id, TaskID: task, Attempt: 1, OccurredAt: event.At(at), Source: "w", Action: "refund",
			Provider: "openai", Model: "gpt-4o", PromptTemplate: "tpl", Stage: event.StageModel, Status: event.StatusOK,
			Output: &event.Output{Text: "Refund per policy 99.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.95), Flags: []string{"fabricated_data"}},
			Usage:  event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100}}
	}
	states := map[string]*task.State{"h-1": {}, "h-2": {}}
	evs := []event.TaskEvent{halluc("h-1", "e-1", b.t0), halluc("h-2", "e-2", b.t0.Add(time.Second))}
	var decided []event.Decision
	for i := range evs {
		in := b.input(int64(i), evs[i])
		d := p.Decide(&evs[i], states[evs[i].TaskID], in.Timestamp.Add(100*time.Millisecond))
		decided = append(decided, d)
		b.routed("audit", in, &evs[i], audited(d))
		b.routed("review", in, &evs[i], d)
		hdr := kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(codec.AlertQuarantined)}
		b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "ALERT", Reason: "output quarantined: " + d.Reason,
			Class: d.Class, TaskID: evs[i].TaskID, Instance: "a", At: d.DecidedAt}, hdr)
		b.item("tpl", evs[i].TaskID, "a", 7, d.DecidedAt.Time, true)
	}
	latched := kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("true")}
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: "MODEL_HALLUCINATION: open until a person resets it", Class: event.ClassHallucination, TaskID: "h-1",
		Instance: "a", At: decided[0].DecidedAt}, latched)

	// reviewers reject h-1's item, a minute later h-2's
	review := func(off int64, id string, at time.Time) (event.Decision, *kgo.Record) {
		rd := event.ReviewDecision{TaskID: id, Reason: "fabricated", Reviewer: "ana", At: event.At(at)}
		v, err := b.c.EncodeReviewDecision(nil, &rd)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: "decisions", Offset: off, Key: []byte(id), Value: v, Timestamp: at}
		b.logs.Decisions = append(b.logs.Decisions, rec)
		d := p.DecideReview(&rd, states[id], at.Add(100*time.Millisecond))
		ev := evs[0]
		if id == "h-2" {
			ev = evs[1]
		}
		b.routed("audit", rec, &ev, audited(d))
		b.item("tpl", id, "a", 7, d.DecidedAt.Time, false)
		return d, rec
	}
	d1, _ := review(0, "h-1", b.t0.Add(time.Minute))
	d2, _ := review(1, "h-2", b.t0.Add(2*time.Minute))
	at := d2
	if reopenEarly {
		at = d1
	}
	task := "h-2"
	if reopenEarly {
		task = "h-1"
	}
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "OPEN", To: "CLOSED",
		Reason: "ana decided the MODEL_HALLUCINATION item of task " + task + ": fabricated", Class: event.ClassHallucination,
		TaskID: task, Instance: "a", At: at.DecidedAt}, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")})
	return b.check()
}

// Guards the latch rule on the instance that reopens a template: a template
// latched by two hallucinations may reopen at the decision of the last open
// item, not of the first, by the items the breakers topic holds
// (breaker.latch_items).
func TestCheckerModelsLatchItems(t *testing.T) {
	if rep := latchRun(t, false); !rep.OK() {
		t.Fatalf("a router's correct outputs (the template reopened at its last item's decision) were reported: %v", rep.Violations)
	}
	rep := latchRun(t, true)
	if rep.ViolationsByCheck["breaker.latch_items"] != 1 {
		t.Fatalf("a template reopened at the first of two items' decisions: %d breaker.latch_items violations, want 1: %v",
			rep.ViolationsByCheck["breaker.latch_items"], rep.Violations)
	}
}
