package router

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// failNextProduceTo makes the broker reject the next produce request that
// carries records for topic (UNKNOWN_SERVER_ERROR on every partition of the
// request: not retried by the client, and not an error that recurs for the
// same records, which the router would dead-letter), so the router's
// transaction of that batch aborts. It returns a
// function that reports whether the fault has fired.
func failNextProduceTo(t *testing.T, c *kfake.Cluster, seeds []kgo.Opt, topic string) func() bool {
	t.Helper()
	id := topicID(t, seeds, topic)
	var fired atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		if !producesTo(req, topic, id) || fired.Load() {
			return nil, nil, false
		}
		resp := answerProduce(req, func(kmsg.ProduceRequestTopic) int16 { return kerr.UnknownServerError.Code })
		fired.Store(true)
		return resp, nil, true
	})
	return fired.Load
}

// clock is a router clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// readAlerts returns the committed BreakerEvents on the alerts topic so far.
func readAlerts(t *testing.T, seeds []kgo.Opt, topic string) []event.BreakerEvent {
	t.Helper()
	c, _ := codec.New()
	var out []event.BreakerEvent
	readCommitted(t, seeds, topic, func(r *kgo.Record) error {
		v, err := c.Decode(r.Value)
		if err != nil {
			return fmt.Errorf("alert does not decode: %w", err)
		}
		out = append(out, *v.(*event.BreakerEvent))
		return nil
	})
	return out
}

func countAlerts(es []event.BreakerEvent, match func(event.BreakerEvent) bool) int {
	n := 0
	for _, e := range es {
		if match(e) {
			n++
		}
	}
	return n
}

// Guards "a batch's breaker changes take effect only when its transaction
// commits": a hallucination whose transaction aborts is consumed again, and
// the committed alerts topic then holds its ALERT and its template breaker's
// CLOSED->OPEN transition exactly once (the transition is not lost because
// the aborted batch had already latched the breaker in memory).
func TestAbortedBatchBreakerLatchRepublished(t *testing.T) {
	c, _, topics, seeds := newTestRouterCluster(t, nil)
	fired := failNextProduceTo(t, c, seeds, topics.Alerts)

	cd, _ := codec.New()
	ev := event.TaskEvent{EventID: "h-1", TaskID: "t-h", Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Provider: "acme", Model: "m1", PromptTemplate: "tpl-x",
		Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "made up", Flags: []string{"fabricated_data"}}}
	v, err := cd.EncodeTaskEvent(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	cl := testClient(t, seeds, topics.Ingress)
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("t-h"), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	opened := func(e event.BreakerEvent) bool {
		return e.Kind == event.BreakerKindTransition && e.Key == "tpl-x" && e.To == breaker.Open.Name()
	}
	alerted := func(e event.BreakerEvent) bool {
		return e.Kind == event.BreakerKindAlert && e.Key == "tpl-x" && e.Class == event.ClassHallucination
	}
	var alerts []event.BreakerEvent
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if alerts = readAlerts(t, seeds, topics.Alerts); countAlerts(alerts, alerted) > 0 {
			break
		}
	}
	if !fired() {
		t.Fatal("the injected produce failure never fired: the test proves nothing")
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would be committed by now
	alerts = readAlerts(t, seeds, topics.Alerts)
	if a, o := countAlerts(alerts, alerted), countAlerts(alerts, opened); a != 1 || o != 1 {
		t.Fatalf("after an aborted batch: %d hallucination alerts and %d CLOSED->OPEN transitions of tpl-x committed, want 1 and 1: %+v", a, o, alerts)
	}
}

// Guards the half-open probe contract across an aborted transaction: the
// batch that half-opens a breaker and releases the held retry as its probe
// aborts; when it is processed again the breaker half-opens again, the probe
// is published, and the HALF_OPEN transition is on the alerts topic. Without
// rollback the probe slot leaks and the breaker stays HALF_OPEN with no probe
// in flight, holding every retry.
func TestAbortedBatchReleasesProbeAgain(t *testing.T) {
	t0 := time.Now()
	clk := &clock{now: t0}
	c, _, topics, seeds := newTestRouterCluster(t, func(cfg *Config) {
		cfg.Now = clk.Now
		cfg.Tick = 50 * time.Millisecond
		p := policy.Default()
		p.Breakers.ProviderModel = policy.Breaker{WindowMs: 60_000, MinRequests: 3, FailureRatio: 0.5, CooldownMs: 8_000, HalfOpenProbes: 1}
		cfg.Policy = p
	})
	cd, _ := codec.New()
	cl := testClient(t, seeds, topics.Ingress, topics.Retry)
	for _, id := range []string{"b-1", "b-2", "b-3"} {
		ev := event.TaskEvent{EventID: "rl-" + id, TaskID: id, Attempt: 1, OccurredAt: event.At(t0),
			Source: "unit", Action: "answer_ticket", Provider: "acme", Model: "m1",
			Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: ptr(int64(1000))}}
		v, err := cd.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(id), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	isOpen := func(e event.BreakerEvent) bool { return e.Key == "acme/m1" && e.To == breaker.Open.Name() }
	for deadline := time.Now().Add(20 * time.Second); countAlerts(readAlerts(t, seeds, topics.Alerts), isOpen) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("acme/m1 never opened")
		}
	}

	// the cooldown passes; the batch that half-opens it and publishes the
	// probe aborts
	fired := failNextProduceTo(t, c, seeds, topics.Retry)
	clk.Set(t0.Add(9 * time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var retries []*kgo.Record
	for len(retries) == 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if r.Topic == topics.Retry {
				retries = append(retries, r)
			}
		})
	}
	if !fired() {
		t.Fatal("the injected produce failure never fired: the test proves nothing")
	}
	if len(retries) != 1 {
		t.Fatalf("after the aborted probe batch: %d retries published, want the probe (1)", len(retries))
	}
	half := func(e event.BreakerEvent) bool { return e.Key == "acme/m1" && e.To == breaker.HalfOpen.Name() }
	if n := countAlerts(readAlerts(t, seeds, topics.Alerts), half); n != 1 {
		t.Errorf("%d OPEN->HALF_OPEN transitions of acme/m1 committed, want 1", n)
	}
}

func ptr[T any](v T) *T { return &v }
