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

// logBuilder writes the records of a small run by hand: inputs, and the
// outputs a router wrote (right or wrong).
type logBuilder struct {
	t     *testing.T
	c     *codec.Codec
	logs  Logs
	t0    time.Time
	audit int64
	// breakerNext is the offset of the next record of the breakers topic
	breakerNext int64
	// policy is the checker's; nil: the default policy
	policy *policy.Policy
	// stops are Options.Stops
	stops map[string][]time.Time
}

func newLog(t *testing.T) *logBuilder {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	return &logBuilder{t: t, c: c, t0: t0, logs: Logs{End: t0.Add(time.Hour)}}
}

func (b *logBuilder) input(off int64, ev event.TaskEvent) *kgo.Record {
	v, err := b.c.EncodeTaskEvent(nil, &ev)
	if err != nil {
		b.t.Fatal(err)
	}
	r := &kgo.Record{Topic: "in", Partition: 0, Offset: off, Key: []byte(ev.TaskID), Value: v, Timestamp: b.t0.Add(time.Duration(off) * 5 * time.Second)}
	b.logs.Ingress = append(b.logs.Ingress, r)
	return r
}

// routed appends a RoutedRecord for input in to the named output topic.
func (b *logBuilder) routed(topic string, in *kgo.Record, ev *event.TaskEvent, d event.Decision) {
	rr := event.Routed{Event: ev, Decision: d}
	if in != nil {
		rr.Input = event.Source{Topic: in.Topic, Partition: in.Partition, Offset: in.Offset, Timestamp: event.At(in.Timestamp)}
	}
	v, err := b.c.EncodeRouted(nil, &rr)
	if err != nil {
		b.t.Fatal(err)
	}
	key := []byte(nil)
	switch {
	case ev != nil:
		key = []byte(ev.TaskID)
	case in != nil: // a decision with no event (a review for an unknown task)
		key = in.Key
	}
	rec := &kgo.Record{Topic: topic, Key: key, Value: v, Timestamp: d.DecidedAt.Time, ProducerID: 7}
	switch topic {
	case "audit":
		rec.Offset = b.audit
		b.audit++
		b.logs.Audit = append(b.logs.Audit, rec)
	case "retry":
		rec.Offset = int64(len(b.logs.Retry))
		b.logs.Retry = append(b.logs.Retry, rec)
	case "review":
		b.logs.Review = append(b.logs.Review, rec)
	case "deadletter":
		b.logs.DeadLetter = append(b.logs.DeadLetter, rec)
	}
}

// repeat names the attempt of the last audit record a repeat, as the
// router's faultrouter.attempt.repeat header does.
func (b *logBuilder) repeat(r policy.Repeat) {
	a := b.logs.Audit[len(b.logs.Audit)-1]
	a.Headers = append(a.Headers, kgo.RecordHeader{Key: codec.HeaderRepeat, Value: []byte(r)})
}

func (b *logBuilder) alert(e event.BreakerEvent, hs ...kgo.RecordHeader) {
	v, err := b.c.EncodeBreakerEvent(nil, &e)
	if err != nil {
		b.t.Fatal(err)
	}
	b.logs.Alerts = append(b.logs.Alerts, &kgo.Record{Topic: "alerts", Offset: int64(len(b.logs.Alerts)), Value: v, ProducerID: 7, Headers: hs})
}

// adoptedFrom is the header of a transition adopted from instance's change.
func adoptedFrom(instance string) kgo.RecordHeader {
	return kgo.RecordHeader{Key: codec.HeaderBreakerAdoptedFrom, Value: []byte(instance)}
}

func (b *logBuilder) check() *Report {
	p := b.policy
	if p == nil {
		p = policy.Default()
	}
	rep, err := Check(b.logs, Options{Policy: p, Ingress: "in", Decisions: "decisions", Stops: b.stops})
	if err != nil {
		b.t.Fatal(err)
	}
	return rep
}

func timeout(task, id string, attempt int32, at time.Time) event.TaskEvent {
	return event.TaskEvent{EventID: id, TaskID: task, Attempt: attempt, OccurredAt: event.At(at), Source: "w", Action: "refund",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v9", Stage: event.StageNetwork, Status: event.StatusError,
		Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}, Usage: event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100}}
}

// run writes a router's correct outputs for a task of two timeouts (retry,
// retry) and a refusal (review), and lets mutate break them first.
func run(t *testing.T, mutate func(b *logBuilder, decided []event.Decision, ins []*kgo.Record, evs []event.TaskEvent)) *Report {
	return runWith(t, policy.Default(), policy.Default(), mutate)
}

// runWith is run with the policy the router decides with (router) and the
// one the checker models (model).
func runWith(t *testing.T, router, model *policy.Policy, mutate func(b *logBuilder, decided []event.Decision, ins []*kgo.Record, evs []event.TaskEvent)) *Report {
	b := newLog(t)
	b.policy = model
	p := router
	evs := []event.TaskEvent{timeout("t-1", "e-1", 1, b.t0), timeout("t-1", "e-2", 2, b.t0.Add(3*time.Second))}
	ref := evs[1]
	ref.EventID, ref.Attempt, ref.Status, ref.Stage, ref.Error = "e-3", 3, event.StatusOK, event.StageModel, nil
	ref.Output = &event.Output{Text: "I cannot help with that request.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}
	evs = append(evs, ref)
	var st task.State
	var decided []event.Decision
	var ins []*kgo.Record
	for i := range evs {
		in := b.input(int64(i), evs[i])
		d := p.Decide(&evs[i], &st, in.Timestamp.Add(100*time.Millisecond))
		decided, ins = append(decided, d), append(ins, in)
	}
	mutate(b, decided, ins, evs)
	return b.check()
}

func ptrTo[T any](v T) *T { return &v }

// audited is the decision as a correct router writes it on the audit
// record: with the cost a stop prevented.
func audited(d event.Decision) event.Decision {
	d.Prevented = policy.Default().PreventedRecord(&d)
	return d
}

// correct writes the outputs a correct router writes.
func correct(b *logBuilder, decided []event.Decision, ins []*kgo.Record, evs []event.TaskEvent, skip string) {
	for i, d := range decided {
		if skip != "audit" || i != 0 {
			b.routed("audit", ins[i], &evs[i], audited(d))
		}
		switch d.Route {
		case event.RouteRetry:
			if skip != "retry" || i != 0 {
				due := d
				due.DecidedAt = d.Retry.NotBefore
				b.routed("retry", nil, &evs[i], due)
			}
		case event.RouteReview:
			if skip != "review" {
				b.routed("review", ins[i], &evs[i], d)
			}
		}
	}
}

// Guards the checker's verdicts: a router's correct outputs pass, and each
// kind of wrong output (a wrong decision, a lost audit record, a retry
// published twice or early, a review record lost, a retry into an open
// breaker) is reported against the task, with its story.
func TestCheckFindsWhatDiffers(t *testing.T) {
	rep := run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		correct(b, d, in, ev, "")
	})
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("correct outputs: %s", s.String())
	}
	if rep.Decisions != 3 || rep.Retries != 2 || rep.Reviews != 1 {
		t.Errorf("counts: %d decisions, %d retries, %d reviews; want 3, 2, 1", rep.Decisions, rep.Retries, rep.Reviews)
	}

	cases := []struct {
		name   string
		check  string
		mutate func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent)
	}{
		{"wrong route", "audit.decision", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			d[2].Route, d[2].Rule = event.RouteDrop, "dedup.redelivery"
			correct(b, d, in, ev, "")
		}},
		{"audit lost", "audit.missing", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			correct(b, d, in, ev, "audit")
		}},
		{"retry twice", "retry.duplicate", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			correct(b, d, in, ev, "")
			due := d[0]
			due.DecidedAt = d[0].Retry.NotBefore
			b.routed("retry", nil, &ev[0], due)
		}},
		{"retry early", "retry.early", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			correct(b, d, in, ev, "retry")
			early := d[0]
			early.DecidedAt = event.At(d[0].Retry.NotBefore.Add(-time.Millisecond))
			b.routed("retry", nil, &ev[0], early)
		}},
		{"review lost", "review.missing", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			correct(b, d, in, ev, "review")
		}},
		{"retry into an open breaker", "breaker.retry_into_open", func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
			correct(b, d, in, ev, "")
			// the breaker opened on the first timeout, before the first retry was due
			b.alert(event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
				Class: event.ClassNetworkTimeout, TaskID: "t-1", Instance: "a", At: d[0].DecidedAt})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := run(t, c.mutate)
			if rep.ViolationsByCheck[c.check] == 0 {
				t.Fatalf("no %s violation; got %v", c.check, rep.ViolationsByCheck)
			}
			if rep.FirstTask == nil || rep.FirstTask.Task != "t-1" || len(rep.FirstTask.Inputs) != 3 {
				t.Fatalf("first failing task: %+v, want t-1 with its 3 inputs", rep.FirstTask)
			}
			var s strings.Builder
			rep.WriteText(&s)
			for _, want := range []string{"FIRST FAILING TASK t-1", "expected outputs", "actual outputs", c.check} {
				if !strings.Contains(s.String(), want) {
					t.Errorf("text report lacks %q:\n%s", want, s.String())
				}
			}
		})
	}
}

// Guards the matching of a published retry to the decision it came from: a
// re-drive re-issues the same event, so when it supersedes a retry that was
// due and not yet published, and its own retry is due at once, the retry
// published in that millisecond fits both windows; it is the re-drive's, as
// its decision says, and neither retry is reported missing.
func TestRetryOfARedriveSupersedingADueRetry(t *testing.T) {
	b := newLog(t)
	p := policy.Default()
	ev := timeout("t-1", "e-1", 1, b.t0)
	ev.Stage, ev.Error = event.StageBusiness, &event.Error{Type: "ValidationError", Code: "CODE_2430", Message: "field total does not add up"}
	var st task.State
	in1 := b.input(0, ev)
	d1 := p.DecideEvent(&ev, &st, nil, in1.Timestamp.Add(100*time.Millisecond))
	if d1.Route != event.RouteRetry {
		t.Fatalf("first decision: %s (%s), want a retry", d1.Route, d1.Reason)
	}
	b.routed("audit", in1, &ev, d1)
	in2 := b.input(1, ev)
	rd := &codec.Redrive{SourceTopic: "deadletter", SourcePartition: 0, SourceOffset: 7, Count: 1, Reason: "upstream fixed"}
	in2.Headers = codec.AppendRedriveHeaders(nil, rd)
	// decided after the first retry was due, before it was published
	at2 := in2.Timestamp.Add(100 * time.Millisecond)
	d2 := p.DecideEvent(&ev, &st, rd, at2)
	if d2.Route != event.RouteRetry || !d2.Retry.NotBefore.Equal(at2) {
		t.Fatalf("re-drive decision: %s not before %v (%s), want a retry due at once", d2.Route, d2.Retry, d2.Reason)
	}
	b.routed("audit", in2, &ev, d2)
	b.repeat(policy.RepeatRedrive)
	due := d2
	due.DecidedAt = d2.Retry.NotBefore
	b.routed("retry", nil, &ev, due)
	rep := b.check()
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("a correct router's outputs: %s", s.String())
	}
}

// Guards the checker's model of shared breakers: a transition an instance
// adopted from another's change on the breakers topic is accepted when some
// instance made that change first (here a's latch, adopted by b), and
// reported (breaker.cause) when none did; an adopted OPEN half-opens at its
// writer's cooldown end, not a cooldown after the adoption.
func TestAdoptedTransitions(t *testing.T) {
	tr := func(inst string, from, to event.BreakerStateName, reason string, at time.Time) event.BreakerEvent {
		return event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "acme/m1", Kind: "TRANSITION", From: from, To: to,
			Reason: reason, Instance: inst, At: event.At(at)}
	}
	rep := run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		correct(b, d, in, ev, "")
		// a opens on a timeout of t-1 (its first decision); b adopts it 20 s
		// later and half-opens with a, 30 s after a opened
		open := tr("a", "CLOSED", "OPEN", "1 of 1 outcomes failed", d[0].DecidedAt.Time)
		open.TaskID, open.Class = "t-1", d[0].Class
		b.alert(open)
		b.alert(tr("b", "CLOSED", "OPEN", "adopted from a: 1 of 1 outcomes failed", d[0].DecidedAt.Add(20*time.Second)), adoptedFrom("a"))
		b.alert(tr("b", "OPEN", "HALF_OPEN", "cooldown over; letting probes through", d[0].DecidedAt.Add(30*time.Second)))
	})
	if n := rep.ViolationsByCheck["breaker.cause"] + rep.ViolationsByCheck["breaker.cooldown"]; n != 0 {
		t.Fatalf("an adoption that follows its writer: %v", rep.Violations)
	}
	rep = run(t, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		correct(b, d, in, ev, "")
		b.alert(tr("b", "CLOSED", "OPEN", "adopted from a: 1 of 1 outcomes failed", d[0].DecidedAt.Time), adoptedFrom("a"))
	})
	if rep.ViolationsByCheck["breaker.cause"] != 1 {
		t.Fatalf("an adoption of a change no instance made was not reported: %v", rep.Violations)
	}
}
