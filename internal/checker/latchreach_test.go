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

// latchElsewhereRun writes the logs of two router instances: a (producer 7)
// routes a hallucination of template tpl (task h-1), which latches it, and
// a reviewer rejects h-1's item a minute later, which reopens it; b
// (producer 8) routes a timeout of task t-1 of the same template 10 s after
// the latch and publishes its retry at publish after its due time (zero: at
// its due time). b's transitions say nothing of the latch: only the model's
// items do.
func latchElsewhereRun(t *testing.T, publish time.Duration) *Report {
	b := newLog(t)
	p := policy.Default()
	const a, other = 7, 8 // producer IDs of instances a and b

	// a: the hallucination, its review record, alert and latch
	h := event.TaskEvent{EventID: "e-h", TaskID: "h-1", Attempt: 1, OccurredAt: event.At(b.t0), Source: "w", Action: "refund",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "tpl", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "Refund per policy 99.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.95), Flags: []string{"fabricated_data"}},
		Usage:  event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100}}
	var hst task.State
	hin := b.input(0, h)
	hd := p.Decide(&h, &hst, hin.Timestamp.Add(100*time.Millisecond))
	b.routed("audit", hin, &h, audited(hd))
	b.routed("review", hin, &h, hd)
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "ALERT", Reason: "output quarantined: " + hd.Reason,
		Class: hd.Class, TaskID: "h-1", Instance: "a", At: hd.DecidedAt},
		kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(codec.AlertQuarantined)})
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: "MODEL_HALLUCINATION: open until a person resets it", Class: event.ClassHallucination, TaskID: "h-1",
		Instance: "a", At: hd.DecidedAt}, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("true")})

	// a: a success of another task 5 s later, in the batch after the one
	// that latched: that one had committed by then
	ok := timeout("s-1", "e-s", 1, b.t0.Add(5*time.Second))
	ok.Stage, ok.Status, ok.Error = event.StageModel, event.StatusOK, nil
	ok.Output = &event.Output{Text: "Done.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}
	var sst task.State
	sin := b.input(1, ok)
	b.routed("audit", sin, &ok, audited(p.Decide(&ok, &sst, sin.Timestamp.Add(100*time.Millisecond))))

	// b: a timeout of t-1 (template tpl) 10 s later, and its retry
	tmo := timeout("t-1", "e-1", 1, b.t0.Add(10*time.Second))
	tmo.PromptTemplate = "tpl"
	var st task.State
	tin := b.input(2, tmo)
	td := p.Decide(&tmo, &st, tin.Timestamp.Add(100*time.Millisecond))
	if td.Route != event.RouteRetry {
		t.Fatalf("the timeout was decided %s (%s), want a retry", td.Route, td.Reason)
	}
	b.routed("audit", tin, &tmo, audited(td))
	b.logs.Audit[len(b.logs.Audit)-1].ProducerID = other
	due := td
	due.DecidedAt = event.At(td.Retry.NotBefore.Add(publish))
	b.routed("retry", nil, &tmo, due)
	b.logs.Retry[len(b.logs.Retry)-1].ProducerID = other

	// a: a reviewer rejects h-1's item a minute after the latch, which
	// reopens the template
	at := b.t0.Add(time.Minute)
	rd := event.ReviewDecision{TaskID: "h-1", Reason: "fabricated", Reviewer: "ana", At: event.At(at)}
	v, err := b.c.EncodeReviewDecision(nil, &rd)
	if err != nil {
		t.Fatal(err)
	}
	rin := &kgo.Record{Topic: "decisions", Offset: 0, Key: []byte("h-1"), Value: v, Timestamp: at}
	b.logs.Decisions = append(b.logs.Decisions, rin)
	rdd := p.DecideReview(&rd, &hst, at.Add(100*time.Millisecond))
	b.routed("audit", rin, &h, audited(rdd))
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "OPEN", To: "CLOSED",
		Reason: "ana decided the MODEL_HALLUCINATION item of task h-1: fabricated", Class: event.ClassHallucination,
		TaskID: "h-1", Instance: "a", At: rdd.DecidedAt}, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")})
	if !td.Retry.NotBefore.Before(at) {
		t.Fatalf("the retry is due at %s, not inside the latch (until %s)", stamp(td.Retry.NotBefore.Time), stamp(at))
	}
	return b.check()
}

// Guards breaker.latch_everywhere: a template latched by a hallucination on
// instance a holds the retries of instance b too. b publishing a retry of
// that template while the latch lasts is reported, though b's own
// transitions never show the latch; b holding it until the reviewer's
// decision reopens the template passes, and counts as a retry the shared
// latch held.
func TestLatchHoldsEverywhere(t *testing.T) {
	rep := latchElsewhereRun(t, 0)
	if rep.ViolationsByCheck["breaker.latch_everywhere"] != 1 {
		t.Fatalf("a retry published on b into a template latched on a: %d breaker.latch_everywhere violations, want 1: %v",
			rep.ViolationsByCheck["breaker.latch_everywhere"], rep.Violations)
	}
	if v := rep.Violations[0]; v.Task != "t-1" || !strings.Contains(v.Detail, "latched since") || !strings.Contains(v.Detail, "task h-1") {
		t.Errorf("the violation does not name the retry's task and the latch: %+v", v)
	}

	rep = latchElsewhereRun(t, time.Minute)
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("b held the retry until the template reopened, yet: %s", s.String())
	}
	if rep.Latch.Stretches != 1 || rep.Latch.HeldElsewhere != 1 {
		t.Fatalf("latch report %+v, want 1 stretch and 1 retry held elsewhere", rep.Latch)
	}
}

// Guards how the check tells when a template was latched: the union of its
// hallucination items' open times; an item opened in the millisecond the
// last open one was decided begins a new stretch (one batch may reopen the
// template, release its held retries and latch it again); a reset applied
// ends the items open then.
func TestLatchStretches(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Second) }
	reset := func(at time.Time) *input {
		return &input{kind: inCommand, command: event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: event.BreakerKindReset},
			audit: &routed{rec: &kgo.Record{}, r: event.Routed{Decision: event.Decision{DecidedAt: event.At(at)}}}}
	}
	cases := []struct {
		name   string
		items  []latchItem
		resets []time.Time
		want   [][2]time.Time // from, to (zero: still latched)
	}{
		{"overlapping items are one stretch", []latchItem{{task: "h-1", opened: s(0), decided: s(10)}, {task: "h-2", opened: s(5), decided: s(20)}},
			nil, [][2]time.Time{{s(0), s(20)}}},
		{"an item opened as the last was decided", []latchItem{{task: "h-1", opened: s(0), decided: s(10)}, {task: "h-2", opened: s(10)}},
			nil, [][2]time.Time{{s(0), s(10)}, {s(10), {}}}},
		{"a reset ends the items open then", []latchItem{{task: "h-1", opened: s(0)}, {task: "h-2", opened: s(5)}, {task: "h-3", opened: s(40)}},
			[]time.Time{s(30)}, [][2]time.Time{{s(0), s(30)}, {s(40), {}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := newChecker(Logs{}, Options{Policy: policy.Default(), Ingress: "in", Decisions: "decisions"})
			if err != nil {
				t.Fatal(err)
			}
			c.latchItems["tpl"] = tc.items
			for i, at := range tc.resets {
				c.inputs[inputKey{"decisions", 0, int64(i)}] = reset(at)
			}
			var got [][2]time.Time
			for _, st := range stretches(c.latchHolds()["tpl"]) {
				got = append(got, [2]time.Time{st.from, st.to})
			}
			if len(got) != len(tc.want) {
				t.Fatalf("stretches %v, want %v", got, tc.want)
			}
			for i := range got {
				if !got[i][0].Equal(tc.want[i][0]) || !got[i][1].Equal(tc.want[i][1]) {
					t.Fatalf("stretches %v, want %v", got, tc.want)
				}
			}
		})
	}
}
