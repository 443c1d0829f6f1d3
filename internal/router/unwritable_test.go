package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// refuseProduceTo makes the broker answer every produce request carrying
// records for topic with code for that topic, while fail() is true. The
// request's other partitions are answered NOT_LEADER_FOR_PARTITION, which the
// client retries in a later request, as a real broker refuses one partition
// batch and stores the others.
func refuseProduceTo(t *testing.T, c *kfake.Cluster, seeds []kgo.Opt, topic string, code int16, fail func() bool) {
	t.Helper()
	id := topicID(t, seeds, topic)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if !producesTo(req, topic, id) || !fail() {
			return nil, nil, false
		}
		return answerProduce(req, func(rt kmsg.ProduceRequestTopic) int16 {
			if rt.Topic != topic && rt.TopicID != id {
				return kerr.NotLeaderForPartition.Code
			}
			return code
		}), nil, true
	})
}

// committedRouted returns the committed RoutedRecords of topic with their
// headers, by event ID.
func committedRouted(t *testing.T, seeds []kgo.Opt, topic string) map[string]*kgo.Record {
	t.Helper()
	c, _ := codec.New()
	out := map[string]*kgo.Record{}
	readCommitted(t, seeds, topic, func(r *kgo.Record) error {
		rr, err := c.DecodeRouted(r.Value)
		if err != nil {
			return err
		}
		if rr.Event != nil {
			out[rr.Event.EventID] = r
		}
		return nil
	})
	return out
}

func unitEvents(t *testing.T) []*kgo.Record {
	cd, _ := codec.New()
	conf := 0.95
	mk := func(id, task string, status event.Status, out *event.Output, er *event.Error) *kgo.Record {
		ev := event.TaskEvent{EventID: id, TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()), Source: "unit", Action: "answer_ticket",
			Stage: event.StageModel, Status: status, Output: out, Error: er}
		v, err := cd.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Key: []byte(task), Value: v}
	}
	return []*kgo.Record{
		mk("ok-1", "t-ok", event.StatusOK, &event.Output{Text: "done", Confidence: &conf}, nil),
		mk("ref-1", "t-ref", event.StatusOK, &event.Output{Text: "I cannot help with that request.", Confidence: &conf}, nil),
		mk("net-1", "t-net", event.StatusError, nil, &event.Error{Type: "TimeoutError", HTTPStatus: 504}),
	}
}

// Guards "an input whose outputs cannot be written for a deterministic
// reason goes to dead letter, is audited, and the batch commits": the broker
// refuses every record sent to the review topic as too large; the event
// routed there is dead-lettered (stage write, kind too_large) with its audit
// record, and the other events of its batch are routed normally.
func TestRefusedRecordDeadLettersItsInputOnly(t *testing.T) {
	c, _, topics, seeds := newTestRouterCluster(t, nil)
	var refusals atomic.Int32
	refuseProduceTo(t, c, seeds, topics.Review, kerr.MessageTooLarge.Code, func() bool { refusals.Add(1); return true })
	cl := testClient(t, seeds, topics.Ingress)
	if err := cl.ProduceSync(context.Background(), unitEvents(t)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var audit map[string]*kgo.Record
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if audit = committedRouted(t, seeds, topics.Audit); len(audit) == 3 {
			break
		}
	}
	if refusals.Load() == 0 {
		t.Fatal("the broker never refused a review record: the test proves nothing")
	}
	cd, _ := codec.New()
	want := map[string][2]string{"ok-1": {"SUCCEEDED", "COMPLETE"}, "ref-1": {"INVALID_INPUT", "DEADLETTER"}, "net-1": {"NETWORK_TIMEOUT", "RETRY"}}
	for id, w := range want {
		rec, ok := audit[id]
		if !ok {
			t.Fatalf("no committed audit record for %s (have %d)", id, len(audit))
		}
		rr, _ := cd.DecodeRouted(rec.Value)
		if string(rr.Decision.Class) != w[0] || string(rr.Decision.Route) != w[1] {
			t.Fatalf("%s decided %s/%s (%s), want %s/%s", id, rr.Decision.Class, rr.Decision.Route, rr.Decision.Reason, w[0], w[1])
		}
	}
	dl := committedRouted(t, seeds, topics.DeadLetter)["ref-1"]
	if dl == nil {
		t.Fatal("the refused event is not on the dead-letter topic")
	}
	if e := codec.ParseHeaders(dl.Headers).Error; e == nil || e.Stage != codec.StageWrite || e.Kind != "too_large" || e.Topic != topics.Ingress {
		t.Fatalf("dead letter headers %+v, want stage write, kind too_large, the input's topic", e)
	}
}

// Guards "a produce error that is not deterministic is retried with backoff
// and the consumer lag metric shows it": while the broker fails every audit
// record with an error that may pass, nothing is committed, the lag gauge
// counts the batch, and the router waits between attempts (no hot loop);
// once the broker recovers the batch commits with every event routed once.
func TestTransientProduceErrorIsRetriedWithBackoff(t *testing.T) {
	c, reg, topics, seeds := newTestRouterCluster(t, nil)
	var failing atomic.Bool
	var attempts atomic.Int32
	failing.Store(true)
	refuseProduceTo(t, c, seeds, topics.Audit, kerr.UnknownServerError.Code, func() bool {
		if failing.Load() {
			attempts.Add(1)
			return true
		}
		return false
	})
	cl := testClient(t, seeds, topics.Ingress)
	if err := cl.ProduceSync(context.Background(), unitEvents(t)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	lagSeen := 0.0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && attempts.Load() < 4; time.Sleep(50 * time.Millisecond) {
		lag, _ := metricValue(t, reg, "faultrouter_consumer_lag_records", "topic", topics.Ingress)
		lagSeen = max(lagSeen, lag)
	}
	if attempts.Load() < 4 {
		t.Fatalf("only %d produce attempts in 20 s", attempts.Load())
	}
	// 4 attempts take at least the backoffs 100+200+400 ms; a hot loop makes hundreds a second
	time.Sleep(time.Second)
	if n := attempts.Load(); n > 12 {
		t.Fatalf("%d produce attempts within seconds: a hot abort loop, not a backoff", n)
	}
	if lagSeen < 3 {
		t.Fatalf("the consumer lag gauge showed %v while the batch could not commit, want its 3 records", lagSeen)
	}
	if n := len(committedRouted(t, seeds, topics.Audit)); n != 0 {
		t.Fatalf("%d audit records committed while every audit produce failed", n)
	}
	failing.Store(false)
	var audit map[string]*kgo.Record
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if audit = committedRouted(t, seeds, topics.Audit); len(audit) == 3 {
			break
		}
	}
	if len(audit) != 3 {
		t.Fatalf("%d events audited after the broker recovered, want 3", len(audit))
	}
}
