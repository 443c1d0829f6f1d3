package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the order of the store write and the next batch (handle.go): the
// Pebble write of a committed batch runs in the background, and the next
// batch reads the states that batch committed from the batch itself (its
// changelog records), not from the store, until that write is done. The
// first write is held back here after its transaction committed; the event
// delivered again meanwhile must still be dropped as a redelivery. Were the
// next batch to read the store before the write, the task would look new
// and the event would be routed afresh.
func TestNextBatchReadsTheStateOfTheBatchBefore(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	beforeStateWrite = func() {
		once.Do(func() {
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
		})
	}
	t.Cleanup(func() { beforeStateWrite = nil }) // runs after the router has stopped
	_, topics, seeds := newTestRouter(t)
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	valid, conf := true, 0.95
	ev := event.TaskEvent{
		EventID: "e-1", TaskID: "t-order", Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf},
	}
	v, err := c.EncodeTaskEvent(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit)
	var audit []event.Routed
	waitAudit := func(n int) {
		t.Helper()
		for len(audit) < n {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("timed out with %d audit records, want %d", len(audit), n)
			}
			fetches.EachRecord(func(r *kgo.Record) {
				rr, err := c.DecodeRouted(r.Value)
				if err != nil {
					t.Fatal(err)
				}
				audit = append(audit, rr)
			})
		}
	}
	produce := func() {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(ev.TaskID), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	produce()
	waitAudit(1) // committed; its store write is held back
	produce()    // the same event again
	time.Sleep(time.Second)
	close(release)
	waitAudit(2)
	if d := audit[0].Decision; d.Class != event.ClassSucceeded || d.Route != event.RouteComplete {
		t.Fatalf("first delivery: %s/%s, want SUCCEEDED/COMPLETE", d.Class, d.Route)
	}
	if d := audit[1].Decision; d.Route != event.RouteDrop {
		t.Fatalf("redelivery polled while the first batch's store write was pending: %s/%s (%s), want it dropped as a redelivery",
			d.Class, d.Route, d.Rule)
	}
}
