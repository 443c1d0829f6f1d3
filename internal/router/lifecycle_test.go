package router

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// lcWorld is a kfake cluster whose answers to the restore's offset requests
// on the state topic can be made to fail, and one router on it.
type lcWorld struct {
	t       *testing.T
	cluster *kfake.Cluster
	seeds   []kgo.Opt
	topics  Topics
	rt      *Router
	codec   *codec.Codec
	// failState makes every ListOffsets request for the state topic fail with
	// TOPIC_AUTHORIZATION_FAILED while set; stateFailures counts them
	failState     atomic.Bool
	stateFailures atomic.Int32
}

func lcStart(t *testing.T, partitions int32) *lcWorld {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	w := &lcWorld{t: t, cluster: cluster, seeds: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}}
	if w.codec, err = codec.New(); err != nil {
		t.Fatal(err)
	}
	set, err := topicspec.Load("")
	if err != nil {
		t.Fatal(err)
	}
	set = set.WithPartitions(partitions)
	adm, err := kgo.NewClient(w.seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := set.Apply(ctx, kadm.NewClient(adm)); err != nil {
		t.Fatal(err)
	}
	name := func(short topicspec.Short) string {
		n, err := set.Name(short)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	w.topics = Topics{
		Ingress: name("ingress"), Decisions: name("decisions"), Retry: name("retry"), Review: name("review"),
		Audit: name("audit"), DeadLetter: name("deadletter"), Alerts: name("alerts"), State: name("state"),
	}
	cluster.ControlKey(int16(kmsg.ListOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if !w.failState.Load() || len(req.Topics) != 1 || req.Topics[0].Topic != w.topics.State {
			return nil, nil, false
		}
		w.stateFailures.Add(1)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return w
}

// run starts the router; it stops at the end of the test.
func (w *lcWorld) run() { w.rt = w.start("lc", nil) }

// start starts a router instance, adjusted by adjust (may be nil); it stops
// at the end of the test.
func (w *lcWorld) start(instance string, adjust func(*Config)) *Router {
	w.t.Helper()
	cfg := w.config(instance)
	if adjust != nil {
		adjust(&cfg)
	}
	rt, err := New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	w.t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				w.t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			w.t.Errorf("Run did not return within 30 s of its context's end (deadlocked)")
		}
	})
	return rt
}

// config is the configuration of a router instance on the world's cluster
// and topics, with a state directory of its own.
func (w *lcWorld) config(instance string) Config {
	cfg := Default()
	cfg.ClientOpts = w.seeds
	cfg.Topics = w.topics
	cfg.StateDir = w.t.TempDir()
	cfg.InstanceID = instance
	cfg.Tick = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

// routes produces one successful event for taskID and waits for its audit
// record: the router is routing.
func (w *lcWorld) routes(taskID string) bool {
	w.t.Helper()
	valid, conf := true, 0.95
	ev := event.TaskEvent{
		EventID: "e-" + taskID, TaskID: taskID, Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf},
	}
	v, err := w.codec.EncodeTaskEvent(nil, &ev)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := testClient(w.t, w.seeds, w.topics.Ingress, w.topics.Audit)
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(taskID), Value: v}).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
	for ctx.Err() == nil {
		found := false
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if rt, err := w.codec.DecodeRouted(r.Value); err == nil && rt.Event != nil && rt.Event.TaskID == taskID {
				found = true
			}
		})
		if found {
			return true
		}
	}
	return false
}

func lcWaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Guards the restore-failure contract: when the restore of the assigned
// partitions fails, the router does not leave the group from inside the
// assignment callback (franz-go documents that as a deadlock), reports not
// ready meanwhile, and retries with a new session until the restore
// succeeds; then it becomes ready and routes.
func TestRestoreFailureRetriesWithoutDeadlock(t *testing.T) {
	w := lcStart(t, 1)
	w.failState.Store(true)
	w.run()
	if !lcWaitFor(30*time.Second, func() bool { return w.stateFailures.Load() >= 2 }) {
		t.Fatalf("the restore asked for the changelog's offsets %d times, want a failure and a retry", w.stateFailures.Load())
	}
	if w.rt.Ready() {
		t.Errorf("ready while the restore fails")
	}
	w.failState.Store(false)
	if !lcWaitFor(60*time.Second, w.rt.Ready) {
		t.Fatalf("not ready within 60 s of the restore working again (%d failed restores)", w.stateFailures.Load())
	}
	if !w.routes("t-after-restore") {
		t.Errorf("no audit record for an event produced after the restore recovered")
	}
}

// Guards /readyz across a rebalance: a ready router whose partitions are
// revoked and whose restore of the new assignment fails reports not ready
// (it used to keep saying ready), and ready again once it owns restored
// partitions.
func TestReadyFollowsRevokeAndRestore(t *testing.T) {
	w := lcStart(t, 2)
	w.run()
	if !lcWaitFor(30*time.Second, w.rt.Ready) {
		t.Fatal("router not ready within 30 s")
	}

	// another member joins the group: the range assignor gives each one
	// partition, and this router's restore of its new partition fails
	w.failState.Store(true)
	other, err := kgo.NewClient(append(w.seeds,
		kgo.ConsumerGroup(Default().Group),
		kgo.ConsumeTopics(w.topics.Ingress, w.topics.Decisions),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.DisableAutoCommit(),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if other.PollFetches(context.Background()).IsClientClosed() {
				return
			}
		}
	}()
	if !lcWaitFor(60*time.Second, func() bool { return !w.rt.Ready() }) {
		other.Close()
		t.Fatalf("still ready after a rebalance whose restore failed (%d failed restores)", w.stateFailures.Load())
	}
	if !lcWaitFor(30*time.Second, func() bool { return w.stateFailures.Load() >= 1 }) {
		t.Errorf("not ready, but no restore failed")
	}

	// the other member leaves and the restore works again
	w.failState.Store(false)
	other.Close()
	if !lcWaitFor(60*time.Second, w.rt.Ready) {
		t.Fatalf("not ready again within 60 s of the restore working")
	}
	if !w.routes("t-after-rebalance") {
		t.Errorf("no audit record for an event produced after the router was ready again")
	}
}

// produce writes one event to the ingress topic.
func (w *lcWorld) produce(ev event.TaskEvent) {
	w.t.Helper()
	v, err := w.codec.EncodeTaskEvent(nil, &ev)
	if err != nil {
		w.t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(w.seeds, kgo.DefaultProduceTopic(w.topics.Ingress))...)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(ev.TaskID), Value: v}).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
}

// committed returns the committed routed records of topic for taskID, read
// from the start of the topic until d passes without a new one.
func (w *lcWorld) committed(topic, taskID string, d time.Duration) []event.Routed {
	w.t.Helper()
	return w.routedByTask(topic, d)[taskID]
}

// routedByTask returns the committed routed records of topic by task, read
// from the start of the topic until d passes without a new one.
func (w *lcWorld) routedByTask(topic string, d time.Duration) map[string][]event.Routed {
	w.t.Helper()
	cl := testClient(w.t, w.seeds, topic, topic)
	out := map[string][]event.Routed{}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if rt, err := w.codec.DecodeRouted(r.Value); err == nil && rt.Event != nil {
				out[rt.Event.TaskID] = append(out[rt.Event.TaskID], rt)
			}
		})
		if n == 0 {
			return out
		}
	}
}

// Guards exactly-once publication of due retries against a zombie instance:
// instance a is evicted from the group without knowing it yet (its
// heartbeats do not reach the coordinator but are answered, as in the window
// after a pause before its heartbeat learns of the eviction), the group
// gives its partition to instance b, and b publishes the retry that falls
// due. a, still believing it owns the partition, publishes the same retry in
// a transaction that consumes nothing. That transaction must be fenced by
// the group generation like any other: a must not add a second retry.
func TestZombieCannotPublishDueRetry(t *testing.T) {
	w := lcStart(t, 1)
	var (
		aMember atomic.Value // string
		hold    atomic.Bool
	)
	w.cluster.ControlKey(int16(kmsg.Heartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		req := kreq.(*kmsg.HeartbeatRequest)
		if aMember.Load() == nil {
			aMember.Store(req.MemberID) // a is alone in the group until b starts
		}
		if hold.Load() && req.MemberID == aMember.Load() {
			// a is told all is well, and the coordinator never hears
			// from it: its session expires without a knowing
			resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
			return resp, nil, true
		}
		return nil, nil, false
	})
	a := w.start("a", func(c *Config) {
		c.SessionTimeout = 6 * time.Second
	})
	if !lcWaitFor(30*time.Second, a.Ready) {
		t.Fatal("a not ready within 30 s")
	}
	if !lcWaitFor(30*time.Second, func() bool { return aMember.Load() != nil }) {
		t.Fatal("no heartbeat from a within 30 s")
	}

	ra := int64(12_000)
	w.produce(event.TaskEvent{
		EventID: "z-1", TaskID: "t-zombie", Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusError,
		Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &ra},
	})
	audit := w.committed(w.topics.Audit, "t-zombie", 3*time.Second)
	if len(audit) != 1 || audit[0].Decision.Route != event.RouteRetry {
		t.Fatalf("audit of t-zombie: %+v, want one RETRY", audit)
	}

	// a goes deaf; b joins, gets the partition once a's session expired,
	// restores the pending retry and publishes it when due
	hold.Store(true)
	regB := prometheus.NewRegistry()
	w.start("b", func(c *Config) { c.Registerer = regB; c.SessionTimeout = 6 * time.Second })
	published := func() bool {
		v, _ := gauge(t, regB, "faultrouter_retries_published_total")
		return v >= 1
	}
	if !lcWaitFor(60*time.Second, published) {
		t.Fatal("b did not publish the due retry within 60 s")
	}
	time.Sleep(2 * time.Second) // a's tick finds the same retry due meanwhile

	if got := w.committed(w.topics.Retry, "t-zombie", 5*time.Second); len(got) != 1 {
		t.Errorf("t-zombie: %d committed retry records, want exactly 1 (b's)", len(got))
	}
}

// gauge returns the value of an unlabelled counter or gauge in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// Guards the partitions an instance owns against a revoke it is not told
// of. franz-go's transactional session passes a revoke on only if no revoke
// came since the session last ended a transaction, so when the group
// rebalances twice while the run loop ends none (a restore that waits for
// an open transaction, in the field), the second revoke is silent. The
// instance kept the partitions it had lost and went on writing their
// states and publishing their due retries, stale and committed, beside
// their new owner. Here the run loop is held while two members join: the
// router must publish the due retries of the partition it was given, and
// none of the partitions the others took.
func TestSilentRevokeLetsThePartitionsGo(t *testing.T) {
	w := lcStart(t, 3)
	var skew atomic.Int64 // the router's clock runs ahead by this much
	// the run loop waits before its next poll while held
	held := lcHook(t, &beforePoll)
	w.rt = w.start("lc", func(c *Config) { c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) } })
	if !lcWaitFor(30*time.Second, func() bool { return w.rt.Ready() && len(w.rt.ownedPartitions()) == 3 }) {
		t.Fatal("the router does not own the three partitions within 30 s")
	}

	// a rate-limited task per partition: each has a retry due in a minute
	byPartition := map[int32][]string{}
	cl := testClient(t, w.seeds, w.topics.Ingress)
	for i := 0; len(byPartition) < 3 || i < 12; i++ {
		id := fmt.Sprintf("t-silent-%d", i)
		p := w.rateLimited(cl, event.TaskEvent{TaskID: id, Action: "answer_ticket"})
		byPartition[p] = append(byPartition[p], id)
	}
	audits := w.routedByTask(w.topics.Audit, 2*time.Second)
	for _, ids := range byPartition {
		for _, id := range ids {
			if a := audits[id]; len(a) != 1 || a[0].Decision.Route != event.RouteRetry {
				t.Fatalf("audit of %s: %+v, want one RETRY", id, a)
			}
		}
	}

	// the run loop waits before its next poll while two members join
	held.hold()
	var mu sync.Mutex
	others := map[string][]int32{} // the ingress partitions each other member was assigned last
	// The group falls back to "range", the only protocol the others offer,
	// which splits the partitions over the members sorted by member ID. An
	// ID is the member's client ID, a dash and a random suffix: the router's
	// client ID is franz-go's default, "kgo", and the others' sort after it,
	// so the router comes first in every round and which partitions it gets
	// is known. (With random IDs alone, the router can sort after the first
	// member, keep the one partition it gets then in every later round, and
	// the test cannot show a silent loss.)
	join := func(name string) *kgo.Client {
		other, err := kgo.NewClient(append(w.seeds,
			kgo.ClientID("zz-"+name),
			kgo.ConsumerGroup(Default().Group),
			kgo.ConsumeTopics(w.topics.Ingress, w.topics.Decisions),
			kgo.Balancers(kgo.RangeBalancer()),
			kgo.DisableAutoCommit(),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				mu.Lock()
				others[name] = a[w.topics.Ingress]
				mu.Unlock()
			}),
		)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(other.Close)
		go func() {
			for !other.PollFetches(context.Background()).IsClientClosed() {
			}
		}()
		return other
	}
	adm := kadm.NewClient(cl)
	// settle waits until the group is stable with the router and the
	// members named, every one assigned, and the router has restored its
	// share; it returns the partitions left to the router
	settle := func(rb uint64, names ...string) []int32 {
		t.Helper()
		var mine []int32
		ok := lcWaitFor(60*time.Second, func() bool {
			mu.Lock()
			gone := map[int32]bool{}
			assigned := 0
			for _, n := range names {
				if len(others[n]) > 0 {
					assigned++
				}
				for _, p := range others[n] {
					gone[p] = true
				}
			}
			mu.Unlock()
			gs, err := adm.DescribeGroups(context.Background(), Default().Group)
			if err != nil {
				return false
			}
			g := gs[Default().Group]
			if g.State != "Stable" || len(g.Members) != len(names)+1 || w.rt.rebalanceCount() <= rb || !w.rt.Ready() ||
				assigned != len(names) || len(gone) > 3-1 {
				return false
			}
			mine = mine[:0]
			for p := range int32(3) {
				if !gone[p] {
					mine = append(mine, p)
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("the group did not settle with the router and %v, each assigned, within 60 s", names)
		}
		return mine
	}

	rb := w.rt.rebalanceCount()
	join("x")
	// the router is told of the revoke, and restores its new assignment:
	// first of two, partitions 0 and 1
	if !lcWaitFor(60*time.Second, func() bool { return w.rt.rebalanceCount() >= rb+2 && w.rt.Ready() }) {
		t.Fatal("the router was not revoked and assigned again within 60 s of a member joining")
	}
	had := map[int32]bool{} // what the router was assigned since the revoke it was told of
	for _, p := range w.rt.ownedPartitions() {
		had[p] = true
	}
	// a third member joins: that revoke is not passed on. First of three,
	// the router keeps partition 0 and loses 1, which it was assigned since
	rb = w.rt.rebalanceCount()
	join("y")
	mine := settle(rb, "x", "y")[0] // three members, a partition each
	if len(had) < 2 || !had[mine] {
		t.Fatalf("the router had %v with one other member and has %d with two, want one of those and one lost", had, mine)
	}
	gone := map[int32]bool{}
	for p := range int32(3) {
		if p != mine {
			gone[p] = true
		}
	}

	// the retries come due; the loop runs on
	skew.Store(int64(2 * time.Minute))
	held.release()
	after := "t-after-release"
	for i, part := 0, kgo.StickyKeyPartitioner(nil).ForTopic(w.topics.Ingress); part.Partition(&kgo.Record{Key: []byte(after)}, 3) != int(mine); i++ {
		after = fmt.Sprintf("t-after-release-%d", i)
	}
	if !w.routes(after) { // the loop has run since
		t.Fatalf("the router routes nothing on its partition %d after the rebalances", mine)
	}
	retries := w.routedByTask(w.topics.Retry, 3*time.Second)
	for _, id := range byPartition[mine] {
		if r := retries[id]; len(r) != 1 {
			t.Errorf("%s (partition %d, the router's): %d retries published, want 1", id, mine, len(r))
		}
	}
	for p := range gone {
		for _, id := range byPartition[p] {
			if r := retries[id]; len(r) != 0 {
				t.Errorf("%s (partition %d, taken by another member): %d retries published by the router, want none", id, p, len(r))
			}
		}
	}
	if owned := w.rt.ownedPartitions(); len(owned) != 1 || owned[0] != mine {
		t.Errorf("the router owns %v, want only partition %d", owned, mine)
	}
}

// lcHold is a test hook of the router's (beforePoll, hold.BeforeTableFetch) that
// waits while held, until released.
type lcHold struct {
	held    atomic.Bool
	ch      chan struct{}
	release func() // lets it go, for good
}

// lcHook sets *hook to wait while the returned hold is held, before the
// router starts, and resets it once the test (and its router) is done.
func lcHook(t *testing.T, hook *func()) *lcHold {
	h := &lcHold{ch: make(chan struct{})}
	h.release = sync.OnceFunc(func() { h.held.Store(false); close(h.ch) })
	*hook = func() {
		if h.held.Load() {
			<-h.ch
		}
	}
	t.Cleanup(func() { *hook = nil })
	t.Cleanup(h.release)
	return h
}

// hold makes the hook wait from now on.
func (h *lcHold) hold() { h.held.Store(true) }

// rateLimited produces, with cl, the first attempt of task ev.TaskID (its
// fields as ev gives them) failed with a 429 whose retry-after is a minute,
// and returns its partition: the router decides a retry due in a minute.
func (w *lcWorld) rateLimited(cl *kgo.Client, ev event.TaskEvent) int32 {
	w.t.Helper()
	ra := int64(60_000)
	ev.EventID, ev.Attempt, ev.OccurredAt, ev.Source = "e-"+ev.TaskID, 1, event.At(time.Now()), "unit"
	ev.Stage, ev.Status = event.StageModel, event.StatusError
	ev.Error = &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: &ra}
	v, err := w.codec.EncodeTaskEvent(nil, &ev)
	if err != nil {
		w.t.Fatal(err)
	}
	rec := &kgo.Record{Key: []byte(ev.TaskID), Value: v}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
	return rec.Partition
}
