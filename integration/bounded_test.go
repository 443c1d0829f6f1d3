package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// boundedWorld produces TaskEvents with a plain client and reads the router's
// decisions back from the audit topic.
type boundedWorld struct {
	e  *env
	c  *codec.Codec
	cl *kgo.Client
}

func newBoundedWorld(t *testing.T, e *env) *boundedWorld {
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ProducerBatchMaxBytes(1<<20),
		kgo.ProducerLinger(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &boundedWorld{e: e, c: c, cl: cl}
}

func (w *boundedWorld) ingress() string { return w.e.prefix + "ai.tasks.ingress" }

// partitionOf is the partition the default (Kafka-compatible) partitioner
// picks for a task among n.
func (w *boundedWorld) partitionOf(task string, n int) int32 {
	p := kgo.StickyKeyPartitioner(nil).ForTopic(w.ingress())
	return int32(p.Partition(&kgo.Record{Key: []byte(task)}, n))
}

// tasksOn returns n task IDs with the prefix whose records land on partition p.
func (w *boundedWorld) tasksOn(prefix string, p int32, n int) []string {
	var ids []string
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if w.partitionOf(id, 3) == p {
			ids = append(ids, id)
		}
	}
	return ids
}

func (w *boundedWorld) record(t *testing.T, ev event.TaskEvent) *kgo.Record {
	t.Helper()
	v, err := w.c.EncodeTaskEvent(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: w.ingress(), Key: []byte(ev.TaskID), Value: v}
}

// produce sends recs in order, asynchronously so that they share batches,
// and waits for all of them.
func (w *boundedWorld) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// decisions reads the audit topic and returns the decision per event ID
// (the latest when an event was audited twice) and the number of audit
// records per task.
func (w *boundedWorld) decisions(t *testing.T) (map[string]event.Decision, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	byEvent, perTask := map[string]event.Decision{}, map[string]int{}
	for _, rec := range readTopic(ctx, t, w.e.prefix+"ai.tasks.audit", true) {
		r, err := w.c.DecodeRouted(rec.Value)
		if err != nil {
			t.Fatalf("audit record %d@%d does not decode: %v", rec.Partition, rec.Offset, err)
		}
		if r.Event != nil {
			byEvent[r.Event.EventID] = r.Decision
			perTask[r.Event.TaskID]++
		}
	}
	return byEvent, perTask
}

// await reads the audit topic until every event of want has a decision, or
// fails the test naming the ones without.
func (w *boundedWorld) await(t *testing.T, r *router, deadline time.Duration, want ...string) map[string]event.Decision {
	t.Helper()
	var got map[string]event.Decision
	var missing []string
	waitFor(deadline, func() bool {
		got, _ = w.decisions(t)
		missing = missing[:0]
		for _, id := range want {
			if _, ok := got[id]; !ok {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0
	})
	if len(missing) > 0 {
		logs := r.logs.String()
		if len(logs) > 4000 {
			logs = logs[len(logs)-4000:]
		}
		t.Fatalf("no decision on the audit topic after %s for %d event(s), first %v; router log tail:\n%s", deadline, len(missing), missing[:min(5, len(missing))], logs)
	}
	return got
}

func boundedEvent(id, task string, attempt int32, status event.Status) event.TaskEvent {
	ev := event.TaskEvent{EventID: id, TaskID: task, Attempt: attempt, OccurredAt: event.At(time.Now()), Source: "it", Action: "answer_ticket",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3", Status: status, Stage: event.StageModel,
		Usage: event.Usage{CostUSD: 0.001, Tokens: 1, ElapsedMs: 1}}
	if status == event.StatusError {
		ev.Stage = event.StageNetwork
		ev.Error = &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream timed out"}
	}
	return ev
}

// Guards "no record the router writes can exceed its topic's limit" for a
// large valid event: a 400 KB output.text of '<' (6 bytes each once
// JSON-escaped) is well under --max-record-bytes, so it is routed by its
// decision, and so are the events polled in the same batch and the events of
// the partition after it. Before the task state kept a bounded copy of the
// event, its state record was 2.4 MB, the broker refused it, and the
// partition stopped for good.
func TestLargeValidEventIsRoutedAndDoesNotStopItsPartition(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	w := newBoundedWorld(t, e)

	tasks := w.tasksOn("t-big", 1, 4)
	big := boundedEvent("big-1", tasks[0], 1, event.StatusOK)
	big.Output = &event.Output{Text: strings.Repeat("<", 400_000)}
	recs := []*kgo.Record{w.record(t, big)}
	var want []string
	for i, id := range tasks[1:] { // the same partition, the same produce batch
		ev := boundedEvent(fmt.Sprintf("next-%d", i), id, 1, event.StatusError)
		recs = append(recs, w.record(t, ev))
		want = append(want, ev.EventID)
	}
	later := boundedEvent("big-2", tasks[0], 2, event.StatusOK) // the same task afterwards: terminal, audited
	recs = append(recs, w.record(t, later))
	w.produce(t, recs...)

	got := w.await(t, r, 90*time.Second, append([]string{"big-1", "big-2"}, want...)...)
	if d := got["big-1"]; d.Class != event.ClassSucceeded || d.Route != event.RouteComplete {
		t.Fatalf("the large event was decided %s/%s (%s), want SUCCEEDED/COMPLETE", d.Class, d.Route, d.Reason)
	}
	if d := got["big-2"]; d.Class != event.ClassDuplicateExecution {
		t.Fatalf("the next event of the large event's task was decided %s/%s, want DUPLICATE_EXECUTION (the task is complete)", d.Class, d.Route)
	}
	for _, id := range want {
		if d := got[id]; d.Class != event.ClassNetworkTimeout || d.Route != event.RouteRetry {
			t.Fatalf("event %s behind the large one was decided %s/%s, want NETWORK_TIMEOUT/RETRY", id, d.Class, d.Route)
		}
	}
	// the partition goes on afterwards
	after := boundedEvent("after-1", tasks[1], 2, event.StatusOK)
	w.produce(t, w.record(t, after))
	if d := w.await(t, r, 60*time.Second, "after-1")["after-1"]; d.Class != event.ClassSucceeded {
		t.Fatalf("an event after the large one was decided %s/%s, want SUCCEEDED", d.Class, d.Route)
	}
}

// Guards the bounded dedup set: a worker looping on a task that is already
// terminal sends 27,000 distinct events; each is audited (DUPLICATE_EXECUTION),
// the task's state record stays under the state topic's limit, and the
// events of other tasks behind the loop on the same partition are routed.
// A redelivery of a recent event of the loop is still caught (DROP). Before
// the dedup set was bounded, the state record outgrew 1 MiB after about 27k
// event IDs and the partition stopped.
func TestLoopOnTerminalTaskKeepsStateBounded(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	w := newBoundedWorld(t, e)

	tasks := w.tasksOn("t-loop", 2, 3)
	loop := tasks[0]
	w.produce(t, w.record(t, boundedEvent("loop-done", loop, 1, event.StatusOK)))
	w.await(t, r, 60*time.Second, "loop-done")

	const n = 27_000
	recs := make([]*kgo.Record, 0, n+3)
	for i := range n {
		ev := boundedEvent(fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", i, i), loop, int32(2+i), event.StatusOK)
		recs = append(recs, w.record(t, ev))
	}
	last := fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", n-1, n-1)
	redelivered := boundedEvent(last, loop, int32(n+1), event.StatusOK)
	behind := []string{"behind-1", "behind-2"}
	recs = append(recs,
		w.record(t, redelivered),
		w.record(t, boundedEvent(behind[0], tasks[1], 1, event.StatusError)),
		w.record(t, boundedEvent(behind[1], tasks[2], 1, event.StatusOK)))
	w.produce(t, recs...)

	got := w.await(t, r, 4*time.Minute, behind...)
	if d := got[behind[0]]; d.Class != event.ClassNetworkTimeout || d.Route != event.RouteRetry {
		t.Fatalf("event behind the loop decided %s/%s, want NETWORK_TIMEOUT/RETRY", d.Class, d.Route)
	}
	if d := got[behind[1]]; d.Class != event.ClassSucceeded {
		t.Fatalf("event behind the loop decided %s/%s, want SUCCEEDED", d.Class, d.Route)
	}
	byEvent, perTask := w.decisions(t)
	// every loop event audited once, the redelivery once more (as a DROP)
	if perTask[loop] != 1+n+1 {
		t.Fatalf("task %s has %d audit records, want %d (one per input record)", loop, perTask[loop], 1+n+1)
	}
	if d := byEvent[last]; d.Route != event.RouteDrop {
		t.Fatalf("the redelivered recent event %s was decided %s/%s, want DROP", last, d.Class, d.Route)
	}
	if d := byEvent[fmt.Sprintf("loop-%08d-0000-4000-8000-%012d", 100, 100)]; d.Class != event.ClassDuplicateExecution {
		t.Fatalf("a loop event was decided %s/%s, want DUPLICATE_EXECUTION", d.Class, d.Route)
	}
	// the task's latest state record is small
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	largest := 0
	for _, rec := range readTopic(ctx, t, e.prefix+"faultrouter.state", true) {
		if string(rec.Key) == loop {
			largest = max(largest, len(rec.Value))
		}
	}
	if largest == 0 || largest > 256<<10 {
		t.Fatalf("the looping task's largest state record is %d bytes, want some and at most 256 KiB", largest)
	}
}

// Guards the dead-letter path of input whose records cannot be written: with
// --max-record-bytes raised to the ingress topic's 1 MiB, a valid event just
// under it would make an audit record over the audit topic's limit, and a
// record that does not decode would make a dead-letter copy (original bytes
// plus error headers) over the dead-letter topic's. Both go to dead letter
// with a bounded copy and headers that say why, both are audited, and the
// events around them in the same partition are routed in the same
// transaction. Before, the broker refused the record and the batch was
// polled and aborted forever.
func TestUnwritableInputIsDeadLetteredAndTheBatchCommits(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir(), "--max-record-bytes", "1048576")
	w := newBoundedWorld(t, e)

	tasks := w.tasksOn("t-edge", 0, 4)
	const size = 1_048_200 // the value of each large record: just under the ingress topic's 1 MiB
	big := boundedEvent("edge-big", tasks[1], 1, event.StatusOK)
	big.Output = &event.Output{Text: ""}
	probe := w.record(t, big)
	big.Output.Text = strings.Repeat("a", size-len(probe.Value))
	bigRec := w.record(t, big)
	big.Output.Text = big.Output.Text[:len(big.Output.Text)-(len(bigRec.Value)-size)] // the length's varint grew
	bigRec = w.record(t, big)
	if len(bigRec.Value) != size {
		t.Fatalf("large event is %d bytes, want %d", len(bigRec.Value), size)
	}
	garbage := &kgo.Record{Topic: w.ingress(), Key: []byte(tasks[2]), Value: []byte(strings.Repeat("x", size))}
	w.produce(t,
		w.record(t, boundedEvent("edge-before", tasks[0], 1, event.StatusOK)),
		bigRec, garbage,
		w.record(t, boundedEvent("edge-after", tasks[3], 1, event.StatusError)))

	got := w.await(t, r, 90*time.Second, "edge-before", "edge-big", "edge-after")
	if d := got["edge-before"]; d.Class != event.ClassSucceeded {
		t.Fatalf("event before the large ones decided %s/%s, want SUCCEEDED", d.Class, d.Route)
	}
	if d := got["edge-after"]; d.Class != event.ClassNetworkTimeout || d.Route != event.RouteRetry {
		t.Fatalf("event after the large ones decided %s/%s, want NETWORK_TIMEOUT/RETRY", d.Class, d.Route)
	}
	if d := got["edge-big"]; d.Class != event.ClassInvalidInput || d.Route != event.RouteDeadLetter || d.Rule != "output.too_large" ||
		!strings.Contains(d.Reason, "max.message.bytes") {
		t.Fatalf("the large valid event decided %s/%s (%s: %s), want INVALID_INPUT/DEADLETTER output.too_large naming the limit", d.Class, d.Route, d.Rule, d.Reason)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sawBig, sawGarbage bool
	for _, rec := range readTopic(ctx, t, e.prefix+"ai.tasks.deadletter", true) {
		h := codec.ParseHeaders(rec.Headers)
		switch string(rec.Key) {
		case tasks[1]:
			rr, err := w.c.DecodeRouted(rec.Value)
			if err != nil || h.Error == nil || h.Error.Stage != codec.StageWrite || h.Error.Kind != "too_large" || h.Error.Offset != bigRec.Offset ||
				rr.Event == nil || len(rr.Event.Output.Text) > 8<<10 || h.Copy == nil || h.Copy.Truncated[0] != "output.text" {
				t.Fatalf("dead letter of the large event: err %v, headers %+v, copy %+v", err, h.Error, h.Copy)
			}
			sawBig = true
		case tasks[2]:
			if h.Error == nil || !h.Error.Raw() || h.Error.OriginalBytes != size || len(rec.Value) > 64<<10 || string(rec.Value[:10]) != "xxxxxxxxxx" {
				t.Fatalf("dead letter of the large undecodable record: headers %+v, %d bytes", h.Error, len(rec.Value))
			}
			sawGarbage = true
		}
	}
	if !sawBig || !sawGarbage {
		t.Fatalf("dead letters: large event %v, large undecodable record %v; want both", sawBig, sawGarbage)
	}
	// the undecodable one has its audit record too (no event in it)
	audits := 0
	for _, rec := range readTopic(ctx, t, e.prefix+"ai.tasks.audit", true) {
		if string(rec.Key) == tasks[2] {
			audits++
		}
	}
	if audits != 1 {
		t.Fatalf("%d audit records of the large undecodable record, want 1", audits)
	}
}
