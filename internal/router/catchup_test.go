package router

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the breakers an assignment begins with: another instance latched a
// prompt template while this instance's breakers table had not read it (it
// was paused, or held back by an open transaction on the topic), and a
// rebalance then gives this instance its partitions again. No batch of the
// assignment may publish the template's due retries on the breakers it
// knew, however long the table takes to read the topic to where it stood
// when the assignment began: past the assignment's wait (hold.TableCatchUp) the
// router stays not ready, says so in faultrouter_breakers_catching_up, and
// publishes nothing; once the table reads on, the retries stay held behind
// the latch.
func TestAssignmentAdoptsTheLatchesWrittenBeforeIt(t *testing.T) {
	w, c := catchUpStart(t, "tpl-latched", "t-catchup", 9)
	held, reg, skew, tpl, ids := c.held, c.reg, c.skew, c.tpl, c.ids

	// the table is held; another instance latches the template: the item
	// of its hallucination
	bcl := c.latchElsewhere(t, w)

	// a member joins that takes decisions partitions only: the router is
	// assigned every ingress partition again
	rb := w.rt.rebalanceCount()
	other, err := kgo.NewClient(append(w.seeds,
		kgo.ConsumerGroup(Default().Group),
		kgo.ConsumeTopics(w.topics.Decisions),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.DisableAutoCommit(),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	go func() {
		for !other.PollFetches(context.Background()).IsClientClosed() {
		}
	}()
	adm := kadm.NewClient(bcl)
	if !lcWaitFor(60*time.Second, func() bool {
		gs, err := adm.DescribeGroups(context.Background(), Default().Group)
		return err == nil && gs[Default().Group].State == "Stable" && len(gs[Default().Group].Members) == 2 && w.rt.rebalanceCount() >= rb+2
	}) {
		t.Fatal("the group did not settle with the router and the new member within 60 s")
	}
	// the retries come due: while the table is held, past the assignment's
	// wait, nothing of the template is published and the router is not ready
	skew.Store(int64(2 * time.Minute))
	time.Sleep(hold.TableCatchUp + 2*time.Second)
	if w.rt.Ready() {
		t.Error("the router is ready while its breakers table has not read what was committed before its assignment")
	}
	if v, _ := gauge(t, reg, "faultrouter_breakers_catching_up"); v != 1 {
		t.Errorf("faultrouter_breakers_catching_up is %v while the assignment waits for the breakers topic, want 1", v)
	}
	retries := w.routedByTask(w.topics.Retry, time.Second)
	for _, id := range ids {
		if r := retries[id]; len(r) != 0 {
			t.Errorf("%s: %d retries published into %s, latched by another instance before the assignment, while this instance had not read the latch", id, len(r), tpl)
		}
	}
	if t.Failed() {
		return
	}

	// the table reads the latch; the assignment begins with it
	held.release()
	if !lcWaitFor(30*time.Second, func() bool { return w.rt.Ready() }) {
		t.Fatal("the router is not ready within 30 s of its breakers table reading on")
	}
	after := "t-after-catchup"
	if !w.routes(after) { // the loop has run since
		t.Fatal("the router routes nothing after the assignment")
	}
	retries = w.routedByTask(w.topics.Retry, 2*time.Second)
	for _, id := range ids {
		if r := retries[id]; len(r) != 0 {
			t.Errorf("%s: %d retries published into %s, latched by another instance before the assignment", id, len(r), tpl)
		}
	}
}

// Guards a latch written while this instance goes on routing, with no
// assignment and no gap between its batches to make it read the breakers
// topic again: its table's reader is held back (a broker it waits for, a
// starved goroutine) while another instance latches a prompt template.
// Once the table is older than hold.FreshFor, no due retry is published, and
// faultrouter_breakers_catching_up says so; once the reader reads on, the
// retries stay held behind the latch.
func TestAStaleTablePublishesNoRetry(t *testing.T) {
	w, c := catchUpStart(t, "tpl-stale", "t-stale", 6)
	held, reg, skew, tpl, ids := c.held, c.reg, c.skew, c.tpl, c.ids

	// the reader is held; another instance latches the template
	c.latchElsewhere(t, w)
	// past the bound the latch may take to reach a batch, the retries come
	// due while the router keeps routing
	time.Sleep(hold.FreshFor + hold.ListEvery + 500*time.Millisecond)
	skew.Store(int64(2 * time.Minute))
	for i := range 6 {
		if !w.routes(fmt.Sprintf("t-stale-busy-%d", i)) {
			t.Fatal("the router stops routing while its breakers table is stale")
		}
		time.Sleep(300 * time.Millisecond)
	}
	if v, _ := gauge(t, reg, "faultrouter_breakers_catching_up"); v != 1 {
		t.Errorf("faultrouter_breakers_catching_up is %v while the breakers table is stale, want 1", v)
	}
	retries := w.routedByTask(w.topics.Retry, time.Second)
	for _, id := range ids {
		if r := retries[id]; len(r) != 0 {
			t.Errorf("%s: %d retries published into %s, latched by another instance %s before, while this instance's table had not read the latch",
				id, len(r), tpl, hold.FreshFor)
		}
	}
	if t.Failed() {
		return
	}

	// the reader reads on: the latch holds the retries
	held.release()
	if !lcWaitFor(10*time.Second, func() bool { v, _ := gauge(t, reg, "faultrouter_breakers_catching_up"); return v == 0 }) {
		t.Fatal("faultrouter_breakers_catching_up stays 1 after the table reads on")
	}
	if !w.routes("t-stale-after") {
		t.Fatal("the router routes nothing after its table reads on")
	}
	retries = w.routedByTask(w.topics.Retry, 2*time.Second)
	for _, id := range ids {
		if r := retries[id]; len(r) != 0 {
			t.Errorf("%s: %d retries published into %s, latched by another instance", id, len(r), tpl)
		}
	}
}

// catchUp is what catchUpStart set up: the hook that holds the breakers
// table back, the router's metrics, its clock's skew, the template and its
// tasks, and the breakers topic.
type catchUp struct {
	held     *lcHold
	reg      *prometheus.Registry
	skew     *atomic.Int64 // the router's clock runs ahead by this much
	tpl      string
	ids      []string
	breakers string
}

// catchUpStart starts a router with a breakers topic, a clock the test
// skews and its breakers table's reader under a hook; once it owns the
// three partitions, it routes at least n rate-limited tasks of template
// tpl (IDs prefix-0, prefix-1, ...), one on every partition, each with a
// retry due in a minute.
func catchUpStart(t *testing.T, tpl, prefix string, n int) (*lcWorld, catchUp) {
	t.Helper()
	w := lcStart(t, 3)
	c := catchUp{held: lcHook(t, &hold.BeforeTableFetch), reg: prometheus.NewRegistry(), skew: new(atomic.Int64), tpl: tpl,
		breakers: "faultrouter.breakers"} // topics/breakers.yaml, applied by lcStart
	w.rt = w.start("lc", func(cfg *Config) {
		cfg.Registerer = c.reg
		cfg.Topics.Breakers = c.breakers
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }
	})
	if !lcWaitFor(30*time.Second, func() bool { return w.rt.Ready() && len(w.rt.ownedPartitions()) == 3 }) {
		t.Fatal("the router does not own the three partitions within 30 s")
	}
	cl := testClient(t, w.seeds, w.topics.Ingress)
	parts := map[int32]bool{}
	for i := 0; len(parts) < 3 || i < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		parts[w.rateLimited(cl, event.TaskEvent{TaskID: id, Action: "answer_ticket", Provider: "openai", Model: "gpt-4o", PromptTemplate: tpl})] = true
		c.ids = append(c.ids, id)
	}
	audits := w.routedByTask(w.topics.Audit, 2*time.Second)
	for _, id := range c.ids {
		if a := audits[id]; len(a) != 1 || a[0].Decision.Route != event.RouteRetry {
			t.Fatalf("audit of %s: %+v, want one RETRY", id, a)
		}
	}
	return w, c
}

// latchElsewhere holds the breakers table back and writes, as another
// instance would, the latch item of c's template (a hallucination of task
// h-other) on the breakers topic; it returns the client that wrote it.
func (c catchUp) latchElsewhere(t *testing.T, w *lcWorld) *kgo.Client {
	t.Helper()
	c.held.hold()
	it := event.BreakerItem{Scope: breaker.PromptTemplate.Name(), Key: c.tpl, TaskID: "h-other", OpenedAt: event.At(w.rt.cfg.Now()), Instance: "other"}
	v, err := event.EncodeBreakerItem(&it)
	if err != nil {
		t.Fatal(err)
	}
	bcl := testClient(t, append(w.seeds, kgo.RecordPartitioner(kgo.ManualPartitioner())), c.breakers) // partition 0, as the product writes
	if err := bcl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(event.BreakerItemKey(it.Scope, it.Key, it.TaskID)), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return bcl
}
