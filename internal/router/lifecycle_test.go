package router

import (
	"context"
	"io"
	"log/slog"
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
	name := func(short string) string {
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
	cfg := Default()
	cfg.ClientOpts = w.seeds
	cfg.Topics = w.topics
	cfg.StateDir = w.t.TempDir()
	cfg.InstanceID = instance
	cfg.Tick = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
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
	cl := testClient(w.t, w.seeds, topic, topic)
	var out []event.Routed
	for {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if rt, err := w.codec.DecodeRouted(r.Value); err == nil && rt.Event != nil && rt.Event.TaskID == taskID {
				out = append(out, rt)
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
