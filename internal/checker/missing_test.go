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

// missingRun writes a run of one router instance ("a", producer 7) that
// decides, one every 100 ms, n first attempts of distinct tasks made by
// newEvent, with the correct audit, retry and review records; then lets
// router write the alerts it wrote (its own alerts name the instance).
func missingRun(t *testing.T, n int, newEvent func(task string, at time.Time) event.TaskEvent,
	router func(b *logBuilder, ds []event.Decision, evs []event.TaskEvent)) *Report {
	b := newLog(t)
	p := policy.Default()
	var ds []event.Decision
	var evs []event.TaskEvent
	var ins []*kgo.Record
	for i := range n {
		at := b.t0.Add(time.Duration(i) * 100 * time.Millisecond)
		ev := newEvent(fmt.Sprintf("t-%d", i), at)
		var st task.State
		in := b.inputAt(int64(i), ev, at)
		d := p.Decide(&ev, &st, at.Add(10*time.Millisecond))
		ds, evs, ins = append(ds, d), append(evs, ev), append(ins, in)
	}
	correct(b, ds, ins, evs, "")
	router(b, ds, evs)
	rep, err := Check(b.logs, Options{Policy: p, Ingress: "in", Decisions: "decisions", Starts: map[string][]time.Time{"a": {b.t0.Add(-time.Minute)}}})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// instanceAlert is an ALERT of the instance about something else: it names the
// instance of producer 7.
func instanceAlert(b *logBuilder) {
	b.alert(event.BreakerEvent{Scope: "TOPIC", Key: "in", Kind: event.BreakerKindAlert, Reason: "partitions", Instance: "a",
		At: event.At(b.t0.Add(-time.Second))}, kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(codec.AlertPartitions)})
}

// Guards breaker.missing_open: when the failures one instance decided fill
// a CLOSED breaker's window past the policy's ratio and min_requests, the
// instance must have opened it in that batch; with its OPEN transition on
// the alerts topic the check is quiet, without it the check fires.
func TestCheckFindsABreakerThatDidNotOpen(t *testing.T) {
	p := policy.Default()
	n := int(p.Breakers.ProviderModel.MinRequests) // all failures: the last one trips it
	mk := func(id string, at time.Time) event.TaskEvent { return timeout(id, id+"-e1", 1, at) }
	opened := missingRun(t, n, mk, func(b *logBuilder, ds []event.Decision, evs []event.TaskEvent) {
		instanceAlert(b)
		last := ds[n-1]
		b.alert(event.BreakerEvent{Scope: "PROVIDER_MODEL", Key: "openai/gpt-4o", Kind: event.BreakerKindTransition, From: "CLOSED", To: "OPEN",
			Class: last.Class, TaskID: evs[n-1].TaskID, Instance: "a", At: last.DecidedAt, Reason: "20 of 20 outcomes failed"},
			kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")})
	})
	if got := opened.ViolationsByCheck["breaker.missing_open"]; got != 0 || opened.BreakerStretches == 0 {
		t.Fatalf("a breaker that opened when its window tripped: %d breaker.missing_open, %d stretches checked; want 0 and > 0:\n%s",
			got, opened.BreakerStretches, report(opened))
	}
	closed := missingRun(t, n, mk, func(b *logBuilder, _ []event.Decision, _ []event.TaskEvent) { instanceAlert(b) })
	if got := closed.ViolationsByCheck["breaker.missing_open"]; got != 1 {
		t.Fatalf("a breaker that never opened although %d of %d outcomes failed: %d breaker.missing_open, want 1:\n%s", n, n, got, report(closed))
	}
	// one failure short of min_requests: nothing had to open
	short := missingRun(t, n-1, mk, func(b *logBuilder, _ []event.Decision, _ []event.TaskEvent) { instanceAlert(b) })
	if got := short.ViolationsByCheck["breaker.missing_open"]; got != 0 {
		t.Fatalf("%d failures, min_requests %d: %d breaker.missing_open, want 0:\n%s", n-1, n, got, report(short))
	}
	// a process whose alerts lack this release's headers (an earlier
	// build) is not checked
	earlier := missingRun(t, n, mk, func(b *logBuilder, _ []event.Decision, _ []event.TaskEvent) {
		b.alert(event.BreakerEvent{Scope: "TOPIC", Key: "in", Kind: event.BreakerKindAlert, Reason: "partitions", Instance: "a",
			At: event.At(b.t0.Add(-time.Second))})
	})
	if got := earlier.ViolationsByCheck["breaker.missing_open"]; got != 0 || earlier.ProcessesUnchecked != 1 {
		t.Fatalf("an earlier build's process: %d breaker.missing_open, %d processes unchecked; want 0 and 1", got, earlier.ProcessesUnchecked)
	}
	// decisions no alert attributes to an instance are not checked
	unknown := missingRun(t, n, mk, func(*logBuilder, []event.Decision, []event.TaskEvent) {})
	if got := unknown.ViolationsByCheck["breaker.missing_open"]; got != 0 || unknown.Unattributed != n {
		t.Fatalf("unattributed decisions: %d breaker.missing_open, %d unattributed; want 0 and %d", got, unknown.Unattributed, n)
	}
}

// Guards surge.missing: when the refusals one instance decided for a prompt
// template reach the surge's min_events and ratio, that instance must have
// alerted the surge.
func TestCheckFindsASurgeThatDidNotFire(t *testing.T) {
	p := policy.Default()
	n := int(p.Surge.MinEvents)
	mk := func(id string, at time.Time) event.TaskEvent {
		ev := timeout(id, id+"-e1", 1, at)
		ev.Stage, ev.Status, ev.Error = event.StageModel, event.StatusOK, nil
		ev.Output = &event.Output{Text: "I cannot help with that request.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.9)}
		return ev
	}
	fired := missingRun(t, n, mk, func(b *logBuilder, ds []event.Decision, evs []event.TaskEvent) {
		instanceAlert(b)
		for _, sc := range []string{"PROMPT_TEMPLATE/refund-v9", "PROVIDER_MODEL/openai/gpt-4o"} {
			scope, key, _ := strings.Cut(sc, "/")
			b.alert(event.BreakerEvent{Scope: event.BreakerScope(scope), Key: key, Kind: event.BreakerKindAlert, Class: ds[n-1].Class, TaskID: evs[n-1].TaskID,
				Instance: "a", At: ds[n-1].DecidedAt, Reason: "surge: 10 of 10 events", Failures: int32(n), Requests: int32(n)},
				kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(codec.AlertSurge)})
		}
	})
	if got := fired.ViolationsByCheck["surge.missing"]; got != 0 {
		t.Fatalf("surges alerted: %d surge.missing, want 0:\n%s", got, report(fired))
	}
	silent := missingRun(t, n, mk, func(b *logBuilder, _ []event.Decision, _ []event.TaskEvent) { instanceAlert(b) })
	if got := silent.ViolationsByCheck["surge.missing"]; got != 2 {
		t.Fatalf("%d refusals of one template and model, no surge alert: %d surge.missing, want 2 (template and model):\n%s", n, got, report(silent))
	}
}
