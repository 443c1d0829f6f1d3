package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Guards the decisions the router makes on its own: poison input goes to the
// dead letter as INVALID_INPUT with rule input.<kind>; a pending retry is
// due only at or after its not-before time and only with the event to
// retry; a breaker command is valid only with a known scope, a key and kind
// RESET or LATCH, and its audit says whether it changed this instance.
func TestRouterOwnDecisions(t *testing.T) {
	now := time.UnixMilli(10_000)
	d := Poison("empty_key", errors.New("record has no key"), now)
	if d.Class != event.ClassInvalidInput || d.Route != event.RouteDeadLetter || d.Rule != "input.empty_key" || d.Reason != "record has no key" {
		t.Errorf("Poison = %+v", d)
	}

	ev := &event.TaskEvent{TaskID: "t1"}
	for _, tt := range []struct {
		name string
		st   task.State
		due  bool
	}{
		{"no pending retry", task.State{LastEvent: ev}, false},
		{"not yet", task.State{LastEvent: ev, Pending: &task.PendingRetry{N: 1, NotBefore: 10_001}}, false},
		{"due now", task.State{LastEvent: ev, LastClass: event.ClassNetworkTimeout, Pending: &task.PendingRetry{N: 2, NotBefore: 10_000, DelayMs: 2000}}, true},
		{"no event to retry", task.State{Pending: &task.PendingRetry{N: 1, NotBefore: 1}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, due := RetryDue(&tt.st, now)
			if due != tt.due {
				t.Fatalf("RetryDue due = %v, want %v", due, tt.due)
			}
			if due && (d.Route != event.RouteRetry || d.Rule != "retry.due" || d.Class != event.ClassNetworkTimeout ||
				d.Retry == nil || d.Retry.N != 2 || d.Retry.DelayMs != 2000) {
				t.Errorf("RetryDue = %+v", d)
			}
		})
	}

	for _, tt := range []struct {
		name     string
		c        event.BreakerEvent
		valid    bool
		wantRule string
	}{
		{"reset", event.BreakerEvent{Kind: event.BreakerKindReset, Scope: "PROMPT_TEMPLATE", Key: "tpl"}, true, "breaker.reset"},
		{"latch", event.BreakerEvent{Kind: event.BreakerKindLatch, Scope: "PROMPT_TEMPLATE", Key: "tpl"}, true, "breaker.latch"},
		{"unknown scope", event.BreakerEvent{Kind: event.BreakerKindReset, Scope: "MOON", Key: "tpl"}, false, "breaker.reset_invalid"},
		{"no key", event.BreakerEvent{Kind: event.BreakerKindLatch, Scope: "DOWNSTREAM"}, false, "breaker.latch_invalid"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ref, invalid := BreakerCommand(&tt.c, now)
			if (invalid == nil) != tt.valid {
				t.Fatalf("BreakerCommand invalid = %+v, want valid %v", invalid, tt.valid)
			}
			if !tt.valid {
				if invalid.Route != event.RouteDrop || invalid.Rule != tt.wantRule {
					t.Errorf("invalid command decision %+v, want DROP %s", invalid, tt.wantRule)
				}
				return
			}
			if ref != (breaker.Ref{Scope: breaker.PromptTemplate, Key: "tpl"}) {
				t.Errorf("ref = %v", ref)
			}
			for _, changed := range []bool{true, false} {
				d := BreakerCommandApplied(&tt.c, ref, changed, now)
				if d.Route != event.RouteComplete || d.Rule != tt.wantRule || strings.Contains(d.Reason, "already") == changed {
					t.Errorf("applied (changed %v) = %+v", changed, d)
				}
			}
		})
	}

	if _, ok := LatchesTemplate(&event.TaskEvent{PromptTemplate: "tpl"}, event.ClassModelRefusal); ok {
		t.Error("a refusal latched its template")
	}
	if ref, ok := LatchesTemplate(&event.TaskEvent{PromptTemplate: "tpl"}, event.ClassHallucination); !ok || ref.Key != "tpl" {
		t.Error("a hallucination did not latch its template")
	}
}

// Guards the forward decision: a record on the wrong partition is audited
// COMPLETE with rule partition.forward, naming both partitions.
func TestForwardDecision(t *testing.T) {
	d := Forward("t1", "ai.tasks.ingress", 4, 0, 3, time.UnixMilli(5))
	if d.Route != event.RouteComplete || d.Rule != "partition.forward" || !strings.Contains(d.Reason, "partition 0") ||
		!strings.Contains(d.Reason, "not 4") || d.DecidedAt.UnixMilli() != 5 {
		t.Errorf("Forward = %+v", d)
	}
}
