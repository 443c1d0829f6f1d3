package control

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the re-drive of cut copies: a dead letter that holds only the
// first bytes of its input, or a record whose event is a bounded copy, is
// skipped with where the original is, since re-driving it would send the
// cut copy in place of the original; a whole dead letter is re-driven with
// its lineage and the operator's reason.
func TestPlanRedriveSkipsCutCopies(t *testing.T) {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	cutRaw := &kgo.Record{Topic: "ai.tasks.deadletter", Key: []byte("t-1"), Value: []byte("xxxx"),
		Headers: (&codec.ErrorInfo{Topic: "ai.tasks.ingress", Partition: 2, Offset: 9, Stage: codec.StageValidate, Kind: "oversize", Message: "big"}).AppendHeaders(
			[]kgo.RecordHeader{{Key: codec.HeaderErrorTruncated, Value: []byte("1048200")}})}
	ev := &event.TaskEvent{EventID: "e-1", TaskID: "t-2", Attempt: 1, OccurredAt: event.At(event.FromMillis(1).Time), Source: "s", Action: "a", Status: event.StatusOK}
	copied := &kgo.Record{Topic: "ai.tasks.review", Key: []byte("t-2"),
		Headers: (&codec.EventCopy{Truncated: []string{"output.text"}, Topic: "ai.tasks.ingress", Partition: 1, Offset: 5}).AppendHeaders(nil)}
	whole := &kgo.Record{Topic: "ai.tasks.deadletter", Partition: 3, Offset: 4, Key: []byte("t-3"), Value: []byte("not avro"),
		Headers: (&codec.ErrorInfo{Topic: "ai.tasks.ingress", Stage: codec.StageDecode, Kind: "malformed", Message: "bad"}).AppendHeaders(nil)}
	found := []replay.Found{
		{Rec: cutRaw, Step: replay.Step{Kind: replay.KindPoison, TaskID: "t-1"}},
		{Rec: copied, Step: replay.Step{Kind: replay.KindRouted, TaskID: "t-2", Event: ev, Decision: &event.Decision{Class: event.ClassModelRefusal}}},
		{Rec: whole, Step: replay.Step{Kind: replay.KindPoison, TaskID: "t-3"}},
	}
	plan, err := PlanRedrive(c, found, "ai.tasks.ingress", RedriveOptions{MaxRedrives: 3, Reason: "fixed the parser"})
	if err != nil {
		t.Fatal(err)
	}
	if plan[0].Out != nil || !strings.Contains(plan[0].Skipped, "first 4 of the original 1048200 bytes") || !strings.Contains(plan[0].Skipped, "ai.tasks.ingress/2@9") {
		t.Fatalf("cut raw copy: out %v, skipped %q", plan[0].Out, plan[0].Skipped)
	}
	if plan[1].Out != nil || !strings.Contains(plan[1].Skipped, "bounded copy") || !strings.Contains(plan[1].Skipped, "ai.tasks.ingress/1@5") {
		t.Fatalf("bounded event copy: out %v, skipped %q", plan[1].Out, plan[1].Skipped)
	}
	h := codec.ParseHeaders(plan[2].Out.Headers)
	if plan[2].Out == nil || string(plan[2].Out.Value) != "not avro" || h.Error != nil || h.Redrive == nil ||
		h.Redrive.Count != 1 || h.Redrive.Reason != "fixed the parser" || h.Redrive.Source() != "ai.tasks.deadletter/3@4" {
		t.Fatalf("whole dead letter re-driven as %+v with headers %+v", plan[2].Out, h)
	}
}
