package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// TestRetryNext guards what a worker takes from a retry: the model to use
// (the router's suggestion first), the feedback, the number, and a next
// attempt that keeps the task and clears the last outcome.
func TestRetryNext(t *testing.T) {
	conf := 0.2
	r := Retry{
		Event: event.TaskEvent{EventID: "e-1", TaskID: "t-1", Attempt: 2, Source: "s", Action: "refund",
			Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v3", Stage: event.StageBusiness, Status: event.StatusError,
			Error:  &event.Error{Code: "CODE_2101"},
			Output: &event.Output{Confidence: &conf}, Usage: event.Usage{CostUSD: 0.1},
			Attributes: map[string]string{"tenant": "acme"}},
		Decision: event.Decision{Feedback: `{"code":"CODE_2101"}`, SuggestedModel: "claude",
			Retry: &event.RetryPlan{N: 2}},
	}
	if r.N() != 2 || r.Model() != "claude" || r.Feedback() != `{"code":"CODE_2101"}` {
		t.Fatalf("N %d, Model %q, Feedback %q", r.N(), r.Model(), r.Feedback())
	}
	n := r.Next()
	if n.TaskID != "t-1" || n.Attempt != 3 || n.Model != "claude" || n.EventID != "" || !n.OccurredAt.IsZero() ||
		n.Error != nil || n.Output != nil || n.Status != "" || n.Usage != (event.Usage{}) ||
		n.PromptTemplate != "refund-v3" || n.Attributes["tenant"] != "acme" {
		t.Fatalf("next attempt %+v", n)
	}
	if r.Event.Attempt != 2 || r.Event.Error == nil {
		t.Fatal("Next changed the retry's own event")
	}
	approved := Retry{Event: event.TaskEvent{Model: "gpt-4o"}}
	if approved.N() != 0 || approved.Model() != "gpt-4o" {
		t.Fatalf("approved retry: N %d, Model %q", approved.N(), approved.Model())
	}
}

// TestReport guards the Reporter's contract: events are filled in (event ID,
// time, source), keyed by task ID on the ingress topic in the wire format;
// a batch with an invalid event is refused whole, naming the field, and
// nothing is sent.
func TestReport(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "p.ai.tasks.ingress"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	cfg := Config{ClientOpts: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, TopicPrefix: "p.", Source: "bot"}
	rep, err := NewReporter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	bad := []*event.TaskEvent{{TaskID: "t-ok", Attempt: 1, Action: "a", Status: event.StatusOK}, {TaskID: "t-bad", Action: "a", Status: event.StatusOK}}
	err = rep.Report(ctx, bad...)
	var fe *event.FieldError
	if !errors.As(err, &fe) || fe.Field != "attempt" {
		t.Fatalf("invalid event: err = %v, want a FieldError for attempt", err)
	}
	good := &event.TaskEvent{TaskID: "t-1", Attempt: 1, Action: "a", Status: event.StatusOK}
	if err := rep.Report(ctx, good); err != nil {
		t.Fatal(err)
	}
	if good.EventID == "" || good.OccurredAt.IsZero() || good.Source != "bot" {
		t.Fatalf("Report did not fill in the event: %+v", good)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("p.ai.tasks.ingress"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, _ := codec.New()
	var got []event.TaskEvent
	for len(got) < 1 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no record on ingress")
		}
		for _, r := range fs.Records() {
			e, err := c.DecodeTaskEvent(r.Value)
			if err != nil || string(r.Key) != e.TaskID {
				t.Fatalf("record key %q: %+v, %v", r.Key, e, err)
			}
			got = append(got, e)
		}
	}
	// nothing of the refused batch (t-ok came first in it) was sent
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	got = append(got, decodeAll(t, c, cl.PollFetches(pctx))...)
	if len(got) != 1 || got[0].TaskID != "t-1" || got[0].EventID != good.EventID {
		t.Fatalf("ingress holds %+v, want only t-1", got)
	}
}

func decodeAll(t *testing.T, c *codec.Codec, fs kgo.Fetches) []event.TaskEvent {
	var out []event.TaskEvent
	for _, r := range fs.Records() {
		e, err := c.DecodeTaskEvent(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestConfig guards the constructors' config errors: no client options and
// no consumer group are ErrConfig, naming what is missing.
func TestConfig(t *testing.T) {
	if _, err := NewReporter(Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no ClientOpts: %v", err)
	}
	if _, err := NewRetries(Config{ClientOpts: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}}, ""); !errors.Is(err, ErrConfig) {
		t.Fatalf("no group: %v", err)
	}
}
