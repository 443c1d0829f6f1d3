package router

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// latchWorld is a router on kfake with the breakers topic, its clock ahead
// by skew, and the records another instance or a person writes to the
// breakers and decisions topics.
type latchWorld struct {
	*lcWorld
	skew     atomic.Int64
	breakers *kgo.Client
	tpl      string
}

const latchBreakers = "faultrouter.breakers" // topics/breakers.yaml, applied by lcStart

func latchStart(t *testing.T) *latchWorld {
	w := &latchWorld{lcWorld: lcStart(t, 3), tpl: "tpl-latched"}
	w.breakers = testClient(t, append(w.seeds, kgo.RecordPartitioner(kgo.ManualPartitioner())), latchBreakers) // partition 0, as the product writes
	return w
}

func (w *latchWorld) run() {
	w.rt = w.start("b", func(c *Config) {
		c.Topics.Breakers = latchBreakers
		c.Now = func() time.Time { return time.Now().Add(time.Duration(w.skew.Load())) }
	})
	if !lcWaitFor(30*time.Second, func() bool { return w.rt.Ready() && len(w.rt.ownedPartitions()) == 3 }) {
		w.t.Fatal("the router does not own the three partitions within 30 s")
	}
}

// write produces recs to the breakers topic, as another instance or a
// person does.
func (w *latchWorld) write(recs ...*kgo.Record) {
	w.t.Helper()
	if err := w.breakers.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
}

// item is the latch item of the template's hallucination of task, opened
// by another instance (a tombstone when !open).
func (w *latchWorld) item(task string, open bool) *kgo.Record {
	w.t.Helper()
	rec := &kgo.Record{Key: []byte(event.BreakerItemKey(breaker.PromptTemplate.Name(), w.tpl, task)),
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte("a")}}}
	if open {
		v, err := event.EncodeBreakerItem(&event.BreakerItem{Scope: breaker.PromptTemplate.Name(), Key: w.tpl, TaskID: task,
			OpenedAt: event.At(time.Now()), Instance: "a"})
		if err != nil {
			w.t.Fatal(err)
		}
		rec.Value = v
	}
	return rec
}

// state is another instance's failure-rate state of the template (c had not
// read the latch when it wrote it); CLOSED is a CLOSED state.
func (w *latchWorld) state(st breaker.State) *kgo.Record {
	w.t.Helper()
	s := event.BreakerState{Scope: breaker.PromptTemplate.Name(), Key: w.tpl, State: st.Name(), Reason: "probes",
		UpdatedAt: event.At(time.Now().Add(time.Hour)), Instance: "c"}
	if st == breaker.Open {
		o := s.UpdatedAt
		s.OpenedAt = &o
	}
	v, err := event.EncodeBreakerState(&s)
	if err != nil {
		w.t.Fatal(err)
	}
	return &kgo.Record{Key: []byte(event.BreakerStateKey(s.Scope, s.Key)), Value: v}
}

// reset writes a person's reset of the template as `faultrouter breaker
// reset` does: its RESET record on the breakers topic and its command on
// every decisions partition.
func (w *latchWorld) reset() {
	w.t.Helper()
	at := event.At(time.Now())
	s := event.BreakerState{Scope: breaker.PromptTemplate.Name(), Key: w.tpl, State: breaker.Closed.Name(), Reset: true,
		Reason: "prompt fixed", UpdatedAt: at, Instance: "ops"}
	v, err := event.EncodeBreakerState(&s)
	if err != nil {
		w.t.Fatal(err)
	}
	w.write(&kgo.Record{Key: []byte(event.BreakerResetKey(s.Scope, s.Key)), Value: v,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte("ops")}}})
	c := event.BreakerEvent{Scope: s.Scope, Key: s.Key, Kind: event.BreakerKindReset, Reason: "prompt fixed", Instance: "ops", At: at}
	cv, err := w.codec.EncodeBreakerEvent(nil, &c)
	if err != nil {
		w.t.Fatal(err)
	}
	cl := testClient(w.t, append(w.seeds, kgo.RecordPartitioner(kgo.ManualPartitioner())), w.topics.Decisions)
	for p := range int32(3) {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Partition: p, Key: []byte(event.BreakerStateKey(s.Scope, s.Key)), Value: cv}).FirstErr(); err != nil {
			w.t.Fatal(err)
		}
	}
}

// retryable produces the rate-limited first attempts of nine tasks of the
// template (on every partition), each with a retry due in a minute, and
// returns their IDs once routed.
func (w *latchWorld) retryable(prefix string) []string {
	w.t.Helper()
	cl := testClient(w.t, w.seeds, w.topics.Ingress)
	var ids []string
	for i := range 9 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		w.rateLimited(cl, event.TaskEvent{TaskID: id, Action: "answer_ticket", Provider: "openai", Model: "gpt-4o", PromptTemplate: w.tpl})
		ids = append(ids, id)
	}
	if !lcWaitFor(30*time.Second, func() bool {
		a := w.routedByTask(w.topics.Audit, time.Second)
		for _, id := range ids {
			if len(a[id]) != 1 {
				return false
			}
		}
		return true
	}) {
		w.t.Fatal("the rate-limited attempts were not routed within 30 s")
	}
	return ids
}

// published counts the retries of ids published so far.
func (w *latchWorld) published(ids []string) map[string]int {
	got := map[string]int{}
	rs := w.routedByTask(w.topics.Retry, time.Second)
	for _, id := range ids {
		if n := len(rs[id]); n > 0 {
			got[id] = n
		}
	}
	return got
}

// Guards what a compacted breakers topic keeps of a latch: a template was
// latched by a hallucination's item on instance a, and instance c, which
// had not read it, wrote its own states of the template after it; the
// cleaner kept the latest record of each key: the item and c's CLOSED. A
// router that starts on that topic holds the template's retries however
// long past their due time, and publishes each exactly once when the item
// is decided.
func TestARouterStartedOnACompactedTopicKeepsTheLatch(t *testing.T) {
	w := latchStart(t)
	w.write(w.item("h-1", true), w.state(breaker.Closed)) // what compaction left
	w.run()
	ids := w.retryable("t-compacted")
	w.skew.Store(int64(48 * time.Hour))
	w.routes("t-after-due-1")
	time.Sleep(time.Second)
	if got := w.published(ids); len(got) != 0 {
		t.Fatalf("retries published into %s, latched by h-1's item: %v", w.tpl, got)
	}
	w.write(w.item("h-1", false)) // a decided the item
	if !lcWaitFor(30*time.Second, func() bool { return len(w.published(ids)) == len(ids) }) {
		t.Fatalf("after the item was decided, %d of %d held retries were published", len(w.published(ids)), len(ids))
	}
	w.routes("t-after-release")
	for id, n := range w.published(ids) {
		if n != 1 {
			t.Errorf("%s: published %d times, want once", id, n)
		}
	}
}

// Guards a RESET applied late: while this router's breakers table is held
// (a paused or lagging instance), a person resets the template, and a newer
// hallucination on another instance latches it again. The RESET command
// reaches this router on its decisions partitions before the table reads
// either record. The template must stay latched here until the newer item
// is decided: no retry is published before that, and each once after.
func TestALateResetDoesNotReleaseANewerLatch(t *testing.T) {
	w := latchStart(t)
	held := lcHook(t, &hold.BeforeTableFetch)
	w.write(w.item("h-1", true))
	w.run()
	ids := w.retryable("t-late-reset")
	held.hold()
	w.reset()
	w.write(w.item("h-2", true))
	w.skew.Store(int64(2 * time.Minute))
	w.routes("t-while-held") // the commands are routed meanwhile
	time.Sleep(time.Second)
	if got := w.published(ids); len(got) != 0 {
		t.Fatalf("retries published into %s while its table was held, after a reset older than h-2's item: %v", w.tpl, got)
	}
	held.release()
	w.routes("t-after-held")
	time.Sleep(time.Second)
	if got := w.published(ids); len(got) != 0 {
		t.Fatalf("retries published into %s after the table read the reset and h-2's newer item: %v", w.tpl, got)
	}
	w.write(w.item("h-2", false))
	if !lcWaitFor(30*time.Second, func() bool { return len(w.published(ids)) == len(ids) }) {
		t.Fatalf("after h-2 was decided, %d of %d held retries were published", len(w.published(ids)), len(ids))
	}
	w.routes("t-after-release")
	for id, n := range w.published(ids) {
		if n != 1 {
			t.Errorf("%s: published %d times, want once", id, n)
		}
	}
}

// Guards what a latch leaves when it ends: instance c, which had not read
// the latch, shared an OPEN of the template by its failure rate while a
// hallucination's item held it latched here. When the item is decided the
// latch ends, but the OPEN's cooldown has not: the template's retries stay
// held, past their due time, until c shares that the breaker closed; then
// each is published once.
func TestALatchThatEndsLeavesTheSharedOpen(t *testing.T) {
	w := latchStart(t)
	w.write(w.item("h-1", true))
	w.run()
	ids := w.retryable("t-latch-ends")
	w.write(w.state(breaker.Open)) // c's OPEN, after the item
	time.Sleep(time.Second)
	w.routes("t-while-latched")   // a batch reads it while the template is latched
	w.write(w.item("h-1", false)) // a decided the item
	w.skew.Store(int64(2 * time.Minute))
	w.routes("t-after-item")
	time.Sleep(time.Second)
	w.routes("t-after-item-2")
	if got := w.published(ids); len(got) != 0 {
		t.Fatalf("retries published into %s when its latch ended inside the cooldown of c's OPEN: %v", w.tpl, got)
	}
	w.write(w.state(breaker.Closed))
	if !lcWaitFor(30*time.Second, func() bool { return len(w.published(ids)) == len(ids) }) {
		t.Fatalf("after c shared that the breaker closed, %d of %d held retries were published", len(w.published(ids)), len(ids))
	}
	w.routes("t-after-close")
	for id, n := range w.published(ids) {
		if n != 1 {
			t.Errorf("%s: published %d times, want once", id, n)
		}
	}
}
