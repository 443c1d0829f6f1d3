package replay

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the range contract of replay --since/--until: RFC 3339 or a
// duration counted back from now.
func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{in: "-2h", want: now.Add(-2 * time.Hour)},
		{in: "30m", want: now.Add(-30 * time.Minute)},
		{in: "now", want: now},
		{in: "2026-11-29T02:00:00Z", want: time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)},
		{in: "2026-11-29T03:00:00+01:00", want: time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)},
		{in: "-7d", want: now.AddDate(0, 0, -7)},
		{in: "-1.5d", bad: true},
		{in: "yesterday", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTime(tc.in, now)
			if tc.bad {
				if !errors.Is(err, ErrBadTime) {
					t.Fatalf("err %v, want ErrBadTime", err)
				}
				return
			}
			if err != nil || !got.Equal(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// Guards the replay filters: task, class, route, provider, model, prompt
// template and the time range, each narrowing the selection.
func TestFilterMatch(t *testing.T) {
	ts := time.Date(2026, 11, 29, 2, 30, 0, 0, time.UTC)
	ev := &event.TaskEvent{TaskID: "t1", Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3"}
	routed := Step{Timestamp: ts, TaskID: "t1", Event: ev, Decision: &event.Decision{Class: event.ClassNetworkTimeout, Route: event.RouteDeadLetter, Rule: "retry.held_expired"}}
	alert := Step{Timestamp: ts, TaskID: "t1", Kind: KindBreaker}
	for _, tc := range []struct {
		name string
		f    Filter
		s    Step
		want bool
	}{
		{"empty matches", Filter{}, routed, true},
		{"task", Filter{Task: "t1"}, routed, true},
		{"other task", Filter{Task: "t2"}, routed, false},
		{"class any case", Filter{Class: "network_timeout"}, routed, true},
		{"route", Filter{Route: "REVIEW"}, routed, false},
		{"rule", Filter{Rule: "retry.held_expired"}, routed, true},
		{"other rule", Filter{Rule: "network_timeout.exhausted"}, routed, false},
		{"rule on a step without decision", Filter{Rule: "retry.held_expired"}, alert, false},
		{"provider model template", Filter{Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3"}, routed, true},
		{"model differs", Filter{Model: "gpt-5"}, routed, false},
		{"provider on a step without event", Filter{Provider: "openai"}, alert, false},
		{"in range", Filter{Since: ts.Add(-time.Hour), Until: ts.Add(time.Hour)}, routed, true},
		{"until is exclusive", Filter{Until: ts}, routed, false},
		{"since is inclusive", Filter{Since: ts}, routed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Match(&tc.s); got != tc.want {
				t.Fatalf("Match = %v, want %v", got, tc.want)
			}
		})
	}
}

// Guards the timeline order: time first, then the data path for records of
// the same millisecond (input before audit before routed records).
func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)
	steps := []Step{
		{Short: "deadletter", Timestamp: t0.Add(time.Second)},
		{Short: "audit", Timestamp: t0.Add(time.Second)},
		{Short: "retry", Timestamp: t0},
		{Short: "ingress", Timestamp: t0.Add(time.Second)},
		{Short: "ingress", Timestamp: t0},
	}
	Timeline(steps)
	var got []string
	for _, s := range steps {
		got = append(got, string(s.Short))
	}
	want := []string{"ingress", "retry", "ingress", "audit", "deadletter"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}

// Guards the re-drive lineage and loop guard: the count grows by one per
// re-drive, old error and lineage headers are replaced, and a record at the
// limit is refused.
func TestLineageAndGuard(t *testing.T) {
	orig := []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-abc")}, {Key: codec.HeaderErrorKind, Value: []byte("avro")},
		{Key: codec.HeaderRedriveCount, Value: []byte("2")}, {Key: codec.HeaderRedriveReason, Value: []byte("old reason")}}
	n := RedriveCount(orig)
	if n != 2 {
		t.Fatalf("RedriveCount = %d, want 2", n)
	}
	if err := Guard(n, 3); err != nil {
		t.Fatalf("Guard(2, 3) = %v, want nil", err)
	}
	hs := Lineage(orig, codec.Redrive{SourceTopic: "p.ai.tasks.deadletter", SourcePartition: 1, SourceOffset: 42, Count: n + 1})
	got := map[string]string{}
	for _, h := range hs {
		if _, dup := got[h.Key]; dup {
			t.Fatalf("header %s twice: %v", h.Key, hs)
		}
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{"traceparent": "00-abc", codec.HeaderRedriveSourceTopic: "p.ai.tasks.deadletter",
		codec.HeaderRedriveSourcePart: "1", codec.HeaderRedriveSourceOffset: "42", codec.HeaderRedriveCount: "3"}
	if len(got) != len(want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("header %s = %q, want %q", k, got[k], v)
		}
	}
	if err := Guard(RedriveCount(hs), 3); !errors.Is(err, ErrLoop) {
		t.Fatalf("Guard at the limit = %v, want ErrLoop", err)
	}
}

// Guards the unknown-outcome guard of a re-drive: a WRITE whose outcome is
// unknown (SUBMITTED or UNKNOWN, or decided OUTCOME_UNKNOWN) is refused
// unless the operator both forces it and gives a reason; anything else
// passes.
func TestGuardUnknownOutcome(t *testing.T) {
	write := func(s event.OpState) *event.TaskEvent {
		return &event.TaskEvent{Operation: &event.Operation{OpID: "op-1", Kind: event.OpWrite, State: s}}
	}
	unknown := &event.Decision{Class: event.ClassOutcomeUnknown}
	for _, tc := range []struct {
		name    string
		ev      *event.TaskEvent
		d       *event.Decision
		force   bool
		reason  string
		refused bool
	}{
		{"submitted write", write(event.OpSubmitted), nil, false, "", true},
		{"unknown write", write(event.OpUnknown), nil, false, "", true},
		{"outcome unknown decision", nil, unknown, false, "", true},
		{"force without reason", write(event.OpUnknown), nil, true, "  ", true},
		{"reason without force", write(event.OpUnknown), nil, false, "checked the ledger", true},
		{"force and reason", write(event.OpUnknown), unknown, true, "checked the ledger: not paid", false},
		{"confirmed write", write(event.OpConfirmed), nil, false, "", false},
		{"submitted generate", &event.TaskEvent{Operation: &event.Operation{OpID: "g", Kind: event.OpGenerate, State: event.OpSubmitted}}, nil, false, "", false},
		{"no operation", &event.TaskEvent{}, &event.Decision{Class: event.ClassNetworkTimeout}, false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := GuardUnknownOutcome(tc.ev, tc.d, tc.force, tc.reason)
			if got := errors.Is(err, ErrUnknownOutcome); got != tc.refused {
				t.Fatalf("GuardUnknownOutcome = %v, want refused %v", err, tc.refused)
			}
		})
	}
}
