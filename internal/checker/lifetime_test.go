package checker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// decision appends a review decision to the decisions topic, produced at at.
func (b *logBuilder) decision(off int64, rd event.ReviewDecision, at time.Time) *kgo.Record {
	v, err := b.c.EncodeReviewDecision(nil, &rd)
	if err != nil {
		b.t.Fatal(err)
	}
	r := &kgo.Record{Topic: "decisions", Offset: off, Key: []byte(rd.TaskID), Value: v, Timestamp: at}
	b.logs.Decisions = append(b.logs.Decisions, r)
	return r
}

// inputAt is input with its own production time.
func (b *logBuilder) inputAt(off int64, ev event.TaskEvent, at time.Time) *kgo.Record {
	r := b.input(off, ev)
	r.Timestamp = at
	return r
}

// tombstone appends a state changelog tombstone of task at at.
func (b *logBuilder) tombstone(task string, at time.Time) {
	if b.logs.State == nil {
		b.logs.State = []*kgo.Record{}
	}
	b.logs.State = append(b.logs.State, &kgo.Record{Topic: "state", Offset: int64(len(b.logs.State)), Key: []byte(task), Timestamp: at})
}

// lifeRun is one task's life in a hand-written log: a policy decides each
// input (events and review decisions, in order, at their times plus
// 100 ms), and the router's outputs are those decisions unless router
// changes one first. fresh marks the inputs the router must decide on a
// fresh state (the model's expectation, which a test states for itself).
type lifeStep struct {
	ev    *event.TaskEvent
	rd    *event.ReviewDecision
	at    time.Time
	fresh bool
}

func lifeRun(t *testing.T, steps []lifeStep, router func(i int, d *event.Decision), after func(b *logBuilder, d []event.Decision)) *Report {
	b := newLog(t)
	p := policy.Default()
	var st task.State
	var ds []event.Decision
	for i, s := range steps {
		now := s.at.Add(100 * time.Millisecond)
		if s.fresh {
			st = task.State{}
		}
		var d event.Decision
		var in *kgo.Record
		ev := s.ev
		var repeat policy.Repeat
		if s.ev != nil {
			in = b.inputAt(int64(i), *s.ev, s.at)
			known := st.TaskID != ""
			d = p.Decide(s.ev, &st, now)
			repeat = p.RepeatOf(s.ev, false, known, in.Timestamp)
		} else {
			in = b.decision(int64(i), *s.rd, s.at)
			d = p.DecideReview(s.rd, &st, now)
			ev = st.LastEvent
		}
		router(i, &d)
		ds = append(ds, d)
		b.routed("audit", in, ev, audited(d))
		if repeat != "" {
			b.repeat(repeat)
		}
		switch d.Route {
		case event.RouteRetry:
			due := d
			due.DecidedAt = event.At(now)
			b.routed("retry", nil, ev, due)
		case event.RouteReview:
			b.routed("review", in, ev, d)
		}
	}
	if after != nil {
		after(b, ds)
	}
	return b.check()
}

func refusal(task string, slaMs int64, at time.Time) *event.TaskEvent {
	return &event.TaskEvent{EventID: task + "-e1", TaskID: task, Attempt: 1, OccurredAt: event.At(at), Source: "w", Action: "refund",
		Status: event.StatusOK, Stage: event.StageModel, SLAMs: &slaMs,
		Output: &event.Output{Text: "I cannot help with that request.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}}
}

func success(task, id string, slaMs int64, at time.Time) *event.TaskEvent {
	return &event.TaskEvent{EventID: id, TaskID: task, Attempt: 2, OccurredAt: event.At(at), Source: "w", Action: "refund",
		Status: event.StatusOK, Stage: event.StageModel, SLAMs: &slaMs,
		Output: &event.Output{Text: "Done.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}}
}

func report(rep *Report) string {
	var s strings.Builder
	rep.WriteText(&s)
	return s.String()
}

// Guards the model's clock: a task's state lives 2 x its SLA after its last
// decision, but not while a review item is open, and an input after the
// state expired is decided on a fresh state. A router that forgets an open
// review item at the task's TTL (and so drops a late decision as
// review.no_open_item), or that keeps a completed task past its TTL (and so
// drops a redelivery after it), or that writes a tombstone while the item is
// open, is reported; the correct router passes.
func TestCheckModelsTheTTL(t *testing.T) {
	b := newLog(t)
	t0 := b.t0
	late := []lifeStep{
		{ev: refusal("t-late", 1000, t0), at: t0},
		// 10 s later: past the task's 2 s TTL, the item is still open
		{rd: &event.ReviewDecision{TaskID: "t-late", Approve: true, Reason: "fine", Reviewer: "ana", At: event.At(t0.Add(10 * time.Second))}, at: t0.Add(10 * time.Second)},
	}
	done := success("t-done", "d-1", 1000, t0)
	redelivery := []lifeStep{{ev: done, at: t0}, {ev: done, at: t0.Add(10 * time.Second), fresh: true}}
	same := func(int, *event.Decision) {}

	if rep := lifeRun(t, late, same, nil); !rep.OK() {
		t.Errorf("a late decision applied: %s", report(rep))
	}
	if rep := lifeRun(t, redelivery, same, nil); !rep.OK() || rep.Lives != 1 {
		t.Errorf("a redelivery after the TTL routed afresh: lives %d, %s", rep.Lives, report(rep))
	}
	// the old router: the item died with its task at 2 s
	rep := lifeRun(t, late, func(i int, d *event.Decision) {
		if i == 1 {
			*d = event.Decision{Class: event.ClassModelRefusal, Route: event.RouteDrop, Rule: "review.no_open_item", Reason: "no open item", DecidedAt: d.DecidedAt}
		}
	}, func(b *logBuilder, d []event.Decision) { b.tombstone("t-late", t0.Add(3*time.Second)) })
	if rep.ViolationsByCheck["audit.decision"] == 0 || rep.ViolationsByCheck["state.expired_early"] == 0 {
		t.Errorf("a router that forgot an open item: want audit.decision and state.expired_early, got %v", rep.ViolationsByCheck)
	}
	// a router that never forgets: the redelivery dropped, no tombstone
	rep = lifeRun(t, redelivery, func(i int, d *event.Decision) {
		if i == 1 {
			*d = event.Decision{Class: event.ClassSucceeded, Route: event.RouteDrop, Rule: "dedup.redelivery", DecidedAt: d.DecidedAt}
		}
	}, func(b *logBuilder, d []event.Decision) {
		b.tombstone("t-other", t0)
		b.logs.End = t0.Add(3 * time.Hour) // past the default policy's expiry bucket (1 h) and then some
	})
	if rep.ViolationsByCheck["audit.decision"] == 0 || rep.ViolationsByCheck["state.never_expired"] == 0 {
		t.Errorf("a router that never forgets: want audit.decision and state.never_expired, got %v", rep.ViolationsByCheck)
	}
}

// Guards the model's account of unknown writes: a reviewer's decision of an
// OUTCOME_UNKNOWN item reconciles the write, and the task then expires; a
// policy that leaves the write unknown is reported (unknown.unreconciled),
// and so is a router that keeps the task past its TTL (an attempt after it
// is decided on the old state).
func TestCheckModelsReconciledWrites(t *testing.T) {
	b := newLog(t)
	t0 := b.t0
	sla := int64(1000)
	held := timeout("t-w", "w-1", 1, t0)
	held.Stage, held.SLAMs = event.StageBusiness, &sla
	held.Operation = &event.Operation{OpID: "op-1", Kind: event.OpWrite, ParamsSHA256: "aa", State: event.OpSubmitted}
	steps := []lifeStep{
		{ev: &held, at: t0},
		{rd: &event.ReviewDecision{TaskID: "t-w", Approve: false, Reason: "it ran", Reviewer: "ana", At: event.At(t0.Add(5 * time.Second))}, at: t0.Add(5 * time.Second)},
		// past 2 x SLA after the decision: a fresh task
		{ev: success("t-w", "w-2", sla, t0.Add(20*time.Second)), at: t0.Add(20 * time.Second), fresh: true},
	}
	if rep := lifeRun(t, steps, func(int, *event.Decision) {}, nil); !rep.OK() || rep.Reconciled != 1 || rep.Lives != 1 {
		t.Errorf("a reconciled write: reconciled %d, lives %d, %s", rep.Reconciled, rep.Lives, report(rep))
	}
	// the router kept the task: the attempt after its TTL is a duplicate
	rep := lifeRun(t, steps, func(i int, d *event.Decision) {
		if i == 2 {
			*d = event.Decision{Class: event.ClassDuplicateExecution, Route: event.RouteComplete, Rule: "duplicate.terminal", DecidedAt: d.DecidedAt}
		}
	}, nil)
	if rep.ViolationsByCheck["audit.decision"] == 0 {
		t.Errorf("a router that kept a reconciled task: want audit.decision, got %v", rep.ViolationsByCheck)
	}
}

// Guards the model of forwarded records: a task event on another partition
// than its task's is audited there as forwarded and copied once to its
// task's partition, where it is decided; a router that routes it where it
// landed, or forwards it without a copy, or twice, is reported.
func TestCheckForwardedInputs(t *testing.T) {
	p := policy.Default()
	run := func(copies int, inPlace bool) *Report {
		b := newLog(t)
		ev := success("t-f", "f-1", 60_000, b.t0)
		ev.Attempt = 1
		rec := b.input(0, *ev)
		home := int32(homeHash.Partition(rec, 3))
		rec.Partition = (home + 1) % 3
		at := rec.Timestamp.Add(100 * time.Millisecond)
		var st task.State
		if inPlace {
			b.routed("audit", rec, ev, audited(p.Decide(ev, &st, at)))
		} else {
			b.routed("audit", rec, ev, audited(policy.Forward("t-f", "in", rec.Partition, home, 3, at)))
			b.repeat(policy.RepeatForwarded)
		}
		for i := range copies {
			cp := &kgo.Record{Topic: "in", Partition: home, Offset: int64(10 + i), Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
				Headers: []kgo.RecordHeader{{Key: codec.HeaderForwardedFrom, Value: []byte(fmt.Sprintf("in/%d/0", rec.Partition))}}}
			b.logs.Ingress = append(b.logs.Ingress, cp)
			st = task.State{}
			b.routed("audit", cp, ev, audited(p.Decide(ev, &st, at.Add(time.Duration(i+1)*time.Millisecond))))
		}
		rep, err := Check(b.logs, Options{Policy: p, Ingress: "in", Decisions: "decisions", Partitions: 3})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := run(1, false); !rep.OK() || rep.Forwarded != 1 {
		t.Errorf("forwarded once: forwarded %d, %s", rep.Forwarded, report(rep))
	}
	for _, c := range []struct {
		name    string
		copies  int
		inPlace bool
		check   string
	}{{"no copy", 0, false, "forward.missing"}, {"two copies", 2, false, "forward.duplicate"}, {"routed where it landed", 0, true, "audit.decision"}} {
		if rep := run(c.copies, c.inPlace); rep.ViolationsByCheck[c.check] == 0 {
			t.Errorf("%s: want %s, got %v", c.name, c.check, rep.ViolationsByCheck)
		}
	}
}

// Guards the model's clock for an input that leaves no state: a reviewer's
// decision for a task whose state expired finds no item (review.no_open_item
// on an unknown task), and the router writes no state for it, so the
// expired state's tombstone, written after such decisions, is on time (the
// model took each for a touch that kept the task alive for 2 x the default
// SLA: state.expired_early); a tombstone before the state expired is still
// reported.
func TestCheckDecisionOnAnExpiredTaskKeepsNoState(t *testing.T) {
	b := newLog(t)
	t0 := b.t0
	steps := []lifeStep{
		{ev: success("t-gone", "g-1", 1000, t0), at: t0},
		// 10 s later: past the task's 2 s TTL, nothing is open
		{rd: &event.ReviewDecision{TaskID: "t-gone", Approve: true, Reason: "late", Reviewer: "ana", At: event.At(t0.Add(10 * time.Second))},
			at: t0.Add(10 * time.Second), fresh: true},
		// and a second reviewer's, decided in the same batch
		{rd: &event.ReviewDecision{TaskID: "t-gone", Approve: false, Reason: "late", Reviewer: "bo", At: event.At(t0.Add(10 * time.Second))},
			at: t0.Add(10 * time.Second)},
	}
	same := func(int, *event.Decision) {}
	rep := lifeRun(t, steps, same, func(b *logBuilder, _ []event.Decision) { b.tombstone("t-gone", t0.Add(12*time.Second)) })
	if !rep.OK() || rep.Lives != 2 { // both reviews are decided on a fresh state
		t.Errorf("a tombstone after a decision that kept no state: lives %d, %s", rep.Lives, report(rep))
	}
	rep = lifeRun(t, steps, same, func(b *logBuilder, _ []event.Decision) { b.tombstone("t-gone", t0.Add(time.Second)) })
	if rep.ViolationsByCheck["state.expired_early"] != 1 {
		t.Errorf("a tombstone 1 s into a 2 s TTL: want state.expired_early, got %v", rep.ViolationsByCheck)
	}
}
