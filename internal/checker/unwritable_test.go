package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// unwritableRun writes a run with a small task event, then one too large
// for the smallest output topic (256 KiB), then another small one, all on
// one partition, and lets router write what it wrote for the large one; the
// small ones are routed correctly.
func unwritableRun(t *testing.T, router func(b *logBuilder, in *kgo.Record, ev *event.TaskEvent, at time.Time)) *Report {
	b := newLog(t)
	p := policy.Default()
	small := func(id string, off int64) {
		ev := timeout(id, id+"-e1", 1, b.t0.Add(time.Duration(off)*time.Second))
		in := b.inputAt(off, ev, ev.OccurredAt.Time)
		var st task.State
		d := p.Decide(&ev, &st, ev.OccurredAt.Add(10*time.Millisecond))
		correct(b, []event.Decision{d}, []*kgo.Record{in}, []event.TaskEvent{ev}, "")
	}
	small("t-before", 0)
	big := timeout("t-big", "t-big-e1", 1, b.t0.Add(time.Second))
	big.Stage, big.Status, big.Error = event.StageModel, event.StatusOK, nil
	big.Output = &event.Output{Text: strings.Repeat("x", 240<<10), SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}
	in := b.inputAt(1, big, big.OccurredAt.Time)
	router(b, in, &big, big.OccurredAt.Add(10*time.Millisecond))
	small("t-after", 2)
	rep, err := Check(b.logs, Options{Policy: p, Ingress: "in", Decisions: "decisions", MaxOutputBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// deadLettered writes what the router writes for an unwritable input: a
// dead-letter RoutedRecord with the event's bounded copy and error headers
// at stage write, and its audit record.
func deadLettered(b *logBuilder, in *kgo.Record, ev *event.TaskEvent, at time.Time, edit func(*codec.ErrorInfo)) {
	cp, _ := task.BoundedCopy(ev)
	d := event.Decision{Class: event.ClassInvalidInput, Route: event.RouteDeadLetter, Rule: "output.too_large",
		Reason: "event cannot be routed: too large", DecidedAt: event.At(at)}
	b.routed("deadletter", in, cp, d)
	e := codec.ErrorInfo{Topic: in.Topic, Partition: in.Partition, Offset: in.Offset, Timestamp: in.Timestamp,
		Stage: codec.StageWrite, Class: string(event.ClassInvalidInput), Kind: "too_large", Message: d.Reason}
	if edit != nil {
		edit(&e)
	}
	dl := b.logs.DeadLetter[len(b.logs.DeadLetter)-1]
	dl.Headers = e.AppendHeaders(dl.Headers)
	b.routed("audit", in, cp, d)
}

// Guards the dead letters of unwritable inputs: a task event too large for
// the smallest output topic is dead-lettered once, with the error headers
// at stage write naming it, audited INVALID_INPUT output.too_large, with no
// other output; an input routed as usual instead, or dead-lettered
// with the wrong headers, is reported.
func TestCheckUnwritableInputs(t *testing.T) {
	ok := unwritableRun(t, func(b *logBuilder, in *kgo.Record, ev *event.TaskEvent, at time.Time) {
		deadLettered(b, in, ev, at, nil)
	})
	if !ok.OK() || ok.Unwritable != 1 || ok.DeadLetters != 1 {
		t.Fatalf("a correctly dead-lettered unwritable input: %d unwritable, %d dead letters, want 1 and 1, and no violation:\n%s",
			ok.Unwritable, ok.DeadLetters, report(ok))
	}

	// the router routed it like any event: audited as a refusal, a review
	// record, no dead letter
	routed := unwritableRun(t, func(b *logBuilder, in *kgo.Record, ev *event.TaskEvent, at time.Time) {
		var st task.State
		d := policy.Default().Decide(ev, &st, at)
		b.routed("audit", in, ev, audited(d))
		b.routed("review", in, ev, d)
	})
	for _, check := range []string{"audit.decision", "deadletter.missing", "review.extra"} {
		if routed.ViolationsByCheck[check] != 1 {
			t.Errorf("an unwritable input routed as usual: %d %s, want 1:\n%s", routed.ViolationsByCheck[check], check, report(routed))
		}
	}

	// dead-lettered with headers that name another stage and input
	headers := unwritableRun(t, func(b *logBuilder, in *kgo.Record, ev *event.TaskEvent, at time.Time) {
		deadLettered(b, in, ev, at, func(e *codec.ErrorInfo) { e.Stage, e.Offset = codec.StageRoute, 7 })
	})
	if headers.ViolationsByCheck["deadletter.unwritable"] != 1 {
		t.Errorf("wrong error headers: %d deadletter.unwritable, want 1:\n%s", headers.ViolationsByCheck["deadletter.unwritable"], report(headers))
	}

}
