package decode

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards what each record becomes: a task event, a review decision, a
// breaker command, a forward of a misplaced one, or a poison input whose
// error kind says why, never a crash.
func TestEachRecordBecomesAnInput(t *testing.T) {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	ev := event.TaskEvent{EventID: "e-1", TaskID: "t-1", Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Provider: "acme", Model: "m1", PromptTemplate: "tpl",
		Stage: event.StageModel, Status: event.StatusOK, Output: &event.Output{Text: "ok"}}
	task, err := c.EncodeTaskEvent(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	review, err := c.EncodeReviewDecision(nil, &event.ReviewDecision{TaskID: "t-1", Approve: true, Reason: "fine", At: event.At(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	reset, err := c.EncodeBreakerEvent(nil, &event.BreakerEvent{Scope: event.ScopePromptTemplate, Key: "tpl", Kind: event.BreakerKindReset, At: event.At(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	alert, err := c.EncodeBreakerEvent(nil, &event.BreakerEvent{Scope: event.ScopePromptTemplate, Key: "tpl", Kind: event.BreakerKindAlert, At: event.At(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Codec: c, MaxRecordBytes: 1 << 20, Decisions: "decisions",
		Misplaced: func(rec *kgo.Record) (int32, bool) { return 4, rec.Partition == 9 }})
	for _, tc := range []struct {
		name    string
		rec     kgo.Record
		kind    Kind
		errKind string
		id      string
	}{
		{"task event", kgo.Record{Topic: "ingress", Key: []byte("t-1"), Value: task}, Task, "", "t-1"},
		{"review decision", kgo.Record{Topic: "decisions", Key: []byte("t-1"), Value: review}, Review, "", "t-1"},
		{"breaker command", kgo.Record{Topic: "decisions", Key: []byte("tpl"), Value: reset}, Command, "", ""},
		{"misplaced task event", kgo.Record{Topic: "ingress", Partition: 9, Key: []byte("t-1"), Value: task}, Forward, "", "t-1"},
		{"oversize", kgo.Record{Topic: "ingress", Key: []byte("t-1"), Value: make([]byte, 1<<20+1)}, Poison, KindOversize, ""},
		{"no key", kgo.Record{Topic: "ingress", Value: task}, Poison, KindEmptyKey, ""},
		{"key of another task", kgo.Record{Topic: "ingress", Key: []byte("t-2"), Value: task}, Poison, KindKeyMismatch, ""},
		{"undecodable bytes", kgo.Record{Topic: "ingress", Key: []byte("t-1"), Value: []byte("not avro")}, Poison, "not_single_object", ""},
		{"an alert on decisions", kgo.Record{Topic: "decisions", Key: []byte("tpl"), Value: alert}, Poison, codec.Kind(codec.ErrWrongSchema), ""},
		{"a task event on decisions", kgo.Record{Topic: "decisions", Key: []byte("t-1"), Value: task}, Poison, codec.Kind(codec.ErrWrongSchema), ""},
	} {
		var in Input
		d.Decode(&tc.rec, nil, &in)
		if in.Kind != tc.kind || in.ErrKind != tc.errKind || in.TaskID() != tc.id {
			t.Errorf("%s: kind %d, error kind %q, task %q (err %v); want kind %d, error kind %q, task %q",
				tc.name, in.Kind, in.ErrKind, in.TaskID(), in.Err, tc.kind, tc.errKind, tc.id)
		}
		if (in.Kind == Poison) != (in.Err != nil) {
			t.Errorf("%s: kind %d with error %v: a poison input says why, and only a poison input has an error", tc.name, in.Kind, in.Err)
		}
	}
}

// Guards the parallel decoding of a large batch: every record is decoded,
// in place and in order, whatever the cores.
func TestAllDecodesEveryRecordInOrder(t *testing.T) {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	n := 5*ParallelMin + 3
	recs := make([]*kgo.Record, n)
	for i := range recs {
		ev := event.TaskEvent{EventID: fmt.Sprint("e-", i), TaskID: fmt.Sprint("t-", i), Attempt: 1, OccurredAt: event.At(time.Now()),
			Source: "unit", Action: "a", Provider: "p", Model: "m", PromptTemplate: "tpl", Stage: event.StageModel, Status: event.StatusOK,
			Output: &event.Output{Text: "ok"}}
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: "ingress", Key: []byte(ev.TaskID), Value: v}
	}
	ins := make([]Input, n)
	refused := 0
	d := New(Config{Codec: c, MaxRecordBytes: 1 << 20, Decisions: "decisions",
		Misplaced: func(*kgo.Record) (int32, bool) { return 0, false },
		Refused: func(in *Input) {
			if in.Event.TaskID == "t-7" {
				in.Kind, in.Unwritable = Poison, true
			}
		}})
	d.All(recs, nil, func(i int) *Input { return &ins[i] })
	for i := range ins {
		if ins[i].Rec != recs[i] || ins[i].Event.TaskID != fmt.Sprint("t-", i) {
			t.Fatalf("input %d is of record %v, task %q", i, ins[i].Rec, ins[i].Event.TaskID)
		}
		if ins[i].Unwritable {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("%d inputs marked unwritable by Refused, want 1", refused)
	}
}
