package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/worker"
)

// Guards pkg/worker, the Go worker's client, against the real router: a
// reported timeout comes back on Retries when due with its plan and model, a
// refusal goes to review, and the reviewer's approval is read back by
// ReviewOutcomes and arrives as a retry of the same task.
func TestGoWorker(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	cfg := worker.Config{ClientOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}, TopicPrefix: e.prefix, Source: "go-it"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rep, err := worker.NewReporter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	conf := 0.9
	timeout := &event.TaskEvent{TaskID: "t-go-timeout", Attempt: 1, Action: "answer_ticket", Provider: "openai", Model: "gpt-4o",
		Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}}
	refusal := &event.TaskEvent{TaskID: "t-go-refusal", Attempt: 1, Action: "answer_ticket", Model: "gpt-4o",
		Stage: event.StageModel, Status: event.StatusOK, Output: &event.Output{Text: "I cannot help with that request.", Confidence: &conf}}
	if err := rep.Report(ctx, timeout, refusal); err != nil {
		t.Fatal(err)
	}

	retries, err := worker.NewRetries(cfg, e.prefix+"go-worker")
	if err != nil {
		t.Fatal(err)
	}
	defer retries.Close()
	r, err := retries.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := time.Now()
	if r.Event.TaskID != "t-go-timeout" || r.Event.EventID != timeout.EventID || r.Decision.Class != event.ClassNetworkTimeout ||
		r.N() != 1 || r.Model() != "gpt-4o" || seen.Before(r.Decision.Retry.NotBefore.Time) {
		t.Fatalf("retry %+v (seen at %v)", r, seen)
	}

	review := byTask(e.tailUntil("review", 60*time.Second, func(recs []map[string]any) bool {
		return len(byTask(recs, "t-go-refusal")) > 0
	}), "t-go-refusal")
	if str(review[0], "decision.class") != "MODEL_REFUSAL" {
		t.Fatalf("review item %v", review[0])
	}
	e.cli("", "review", "decide", "--task", "t-go-refusal", "--approve", "--reason", "fine", "--reviewer", "it")
	outcomes, err := worker.NewReviewOutcomes(cfg, e.prefix+"go-worker-reviews")
	if err != nil {
		t.Fatal(err)
	}
	defer outcomes.Close()
	out, err := outcomes.Await(ctx, "t-go-refusal")
	if err != nil {
		t.Fatal(err)
	}
	if !out.Approved || out.Rejected || out.Decision.Rule != "MANUAL_OVERRIDE_SUCCESS" {
		t.Fatalf("review outcome %+v", out)
	}
	back, err := retries.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if back.Event.TaskID != "t-go-refusal" || back.Decision.Rule != "MANUAL_OVERRIDE_SUCCESS" {
		t.Fatalf("retry after approval %+v", back)
	}
}
