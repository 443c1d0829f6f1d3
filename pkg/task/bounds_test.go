package task

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the dedup bound: the set keeps the latest MaxSeenEvents IDs, so a
// redelivery of a recent event is caught however long a task runs, and the
// set never grows past the bound; a long ID is kept as a short hash and
// still matches.
func TestDedupSetIsBounded(t *testing.T) {
	var s State
	for i := range 27_000 {
		s.MarkSeen(fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", i, i))
	}
	if len(s.SeenEvents) != MaxSeenEvents {
		t.Fatalf("dedup set holds %d IDs, want %d", len(s.SeenEvents), MaxSeenEvents)
	}
	recent := fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", 26_999-MaxSeenEvents+1, 26_999-MaxSeenEvents+1)
	old := fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", 26_999-MaxSeenEvents, 26_999-MaxSeenEvents)
	if !s.Seen(recent) || s.Seen(old) {
		t.Fatalf("Seen(recent) = %v, Seen(older than the bound) = %v; want true, false", s.Seen(recent), s.Seen(old))
	}
	long := strings.Repeat("<", 1000)
	s.MarkSeen(long)
	if last := s.SeenEvents[len(s.SeenEvents)-1]; len(last) > maxKeyBytes || !s.Seen(long) || s.Seen(long+"x") {
		t.Fatalf("a long ID is kept as %q (%d bytes); Seen(it) = %v", last, len(last), s.Seen(long))
	}
}

// Guards the bounded copy of the last event: free text over its budget is
// cut and named, identity fields stay whole, and the copy shares nothing with
// the event it was made from.
func TestBoundedCopy(t *testing.T) {
	ra := int64(5)
	ev := &event.TaskEvent{EventID: "e-1", TaskID: "t-1", Model: "gpt-4o", PromptTemplate: "refund-v3",
		Error:      &event.Error{Type: "TimeoutError", Message: strings.Repeat("m", 10_000), RetryAfterMs: &ra},
		Output:     &event.Output{Text: strings.Repeat("<", 400_000), Flags: []string{"fabricated_data"}},
		Attributes: map[string]string{"a": "1", "b": strings.Repeat("é", 2_000)}}
	c, cut := BoundedCopy(ev)
	if len(c.Output.Text) != maxCopyText || len(c.Error.Message) != maxCopyMessage || len(c.Attributes["b"]) > maxCopyAttrValue {
		t.Fatalf("copy keeps %d bytes of text, %d of message, %d of attribute b", len(c.Output.Text), len(c.Error.Message), len(c.Attributes["b"]))
	}
	if strings.Join(cut, ",") != "error.message,output.text,attributes" {
		t.Fatalf("cut fields %v", cut)
	}
	if c.EventID != "e-1" || c.Model != "gpt-4o" || c.PromptTemplate != "refund-v3" || c.Attributes["a"] != "1" || c.Output.Flags[0] != "fabricated_data" {
		t.Fatalf("identity fields or small fields changed: %+v", c)
	}
	ev.Output.Flags[0], *ev.Error.RetryAfterMs, ev.Attributes["a"] = "x", 9, "2"
	if c.Output.Flags[0] != "fabricated_data" || *c.Error.RetryAfterMs != 5 || c.Attributes["a"] != "1" {
		t.Fatal("the copy aliases the event")
	}
	if _, cut := BoundedCopy(&event.TaskEvent{EventID: "e", Output: &event.Output{Text: "ok"}}); cut != nil {
		t.Fatalf("a small event was cut: %v", cut)
	}
	// attributes within their bounds are copied whole, into a map of the copy's own
	small := &event.TaskEvent{EventID: "e", Attributes: map[string]string{"tenant": "acme", "region": "eu", "b": strings.Repeat("é", 500)}}
	c, cut = BoundedCopy(small)
	if cut != nil || !maps.Equal(c.Attributes, small.Attributes) {
		t.Fatalf("small attributes copied as %v (cut %v), want %v", c.Attributes, cut, small.Attributes)
	}
	small.Attributes["tenant"] = "other"
	if c.Attributes["tenant"] != "acme" {
		t.Fatal("the copy's attributes alias the event's")
	}
}

// Guards the state record bound: a state whose every field is at its limit,
// made of the character JSON escapes to six bytes, still encodes far below
// the state topic's 1 MiB (docs/data-path.md: under 256 KiB).
func TestWorstCaseStateIsBounded(t *testing.T) {
	id := strings.Repeat("<", event.MaxIDBytes)
	huge := strings.Repeat("<", 500_000)
	ev := &event.TaskEvent{EventID: id, TaskID: id, Source: id, Action: id, Provider: id, Model: id, PromptTemplate: id,
		Error:      &event.Error{Type: id, Code: id, Message: huge},
		Output:     &event.Output{Text: huge, Flags: strings.Split(strings.Repeat(id+",", 100), ",")},
		Operation:  &event.Operation{OpID: id, ParamsSHA256: id, Kind: event.OpWrite, State: event.OpUnknown},
		InputRef:   &event.InputRef{URI: huge, SHA256: huge},
		Attributes: map[string]string{}}
	for i := range 200 {
		ev.Attributes[fmt.Sprintf("%s-%d", strings.Repeat("<", 100), i)] = huge[:5000]
	}
	s := State{TaskID: id}
	for i := range 5000 {
		s.MarkSeen(fmt.Sprintf("%s-%d", id, i))
		s.AddOperation(Operation{OpID: fmt.Sprintf("%s-%d", id, i), Kind: event.OpWrite, ParamsSHA256: id, State: event.OpUnknown})
	}
	s.SetLastEvent(ev)
	s.LastInput = &event.Source{Topic: id}
	s.SetTraceparent(huge)
	v, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) > 256<<10 {
		t.Fatalf("worst-case state record is %d bytes, want at most 256 KiB", len(v))
	}
	t.Logf("worst-case state record: %d bytes", len(v))
}

// Guards the operations bound: beyond MaxOperations the oldest resolved
// operation is forgotten first, so that a WRITE whose outcome is unknown is
// kept (an expired memory must never let a lost-receipt write run again).
func TestOperationsAreBoundedKeepingUnknownWrites(t *testing.T) {
	var s State
	s.AddOperation(Operation{OpID: "pay-1", Kind: event.OpWrite, State: event.OpUnknown})
	for i := range 200 {
		s.AddOperation(Operation{OpID: fmt.Sprintf("gen-%d", i), Kind: event.OpGenerate, State: event.OpConfirmed})
	}
	if len(s.Operations) != MaxOperations || s.Op("pay-1") == nil || s.Op("gen-199") == nil || s.Op("gen-0") != nil {
		t.Fatalf("%d operations; pay-1 kept %v, newest kept %v, oldest forgotten %v", len(s.Operations), s.Op("pay-1") != nil, s.Op("gen-199") != nil, s.Op("gen-0") == nil)
	}
	long := strings.Repeat("x", 300)
	s.AddOperation(Operation{OpID: long, Kind: event.OpWrite, ParamsSHA256: strings.Repeat("AB", 40), State: event.OpSubmitted})
	op := s.Op(long)
	if op == nil || len(op.OpID) > maxKeyBytes || !op.SameParams(strings.Repeat("AB", 40)) || op.SameParams("ab") {
		t.Fatalf("a long operation ID is not found by its ID, or its params do not compare: %+v", op)
	}
}
