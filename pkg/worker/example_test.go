package worker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
	"github.com/faultrouter/faultrouter/pkg/worker"
)

// A worker's loop: report an attempt that timed out, take the retry the
// router publishes when it is due, report the next attempt.
func Example() {
	brokers, stop := embeddedRouter()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cfg := worker.Config{ClientOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}, Source: "support-bot"}
	rep, err := worker.NewReporter(cfg)
	if err != nil {
		panic(err)
	}
	defer rep.Close()
	first := &event.TaskEvent{TaskID: "t-42", Attempt: 1, Action: "answer_ticket", Provider: "openai", Model: "gpt-4o",
		Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}}
	if err := rep.Report(ctx, first); err != nil {
		panic(err)
	}

	retries, err := worker.NewRetries(cfg, "support-bot")
	if err != nil {
		panic(err)
	}
	defer retries.Close()
	r, err := retries.Next(ctx) // published when due: one second after the timeout
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Event.TaskID, r.Decision.Class, "retry", r.N(), "with", r.Model())

	next := r.Next()
	next.Stage, next.Status = event.StageModel, event.StatusOK
	next.Usage = event.Usage{CostUSD: 0.01, Tokens: 420, ElapsedMs: 900}
	if err := rep.Report(ctx, &next); err != nil {
		panic(err)
	}
	fmt.Println("reported attempt", next.Attempt, next.Status)
	// Output:
	// t-42 NETWORK_TIMEOUT retry 1 with gpt-4o
	// reported attempt 2 OK
}

// A refusal goes to human review; the worker waits for what the reviewer
// decided.
func ExampleReviewOutcomes_Await() {
	brokers, stop := embeddedRouter()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cfg := worker.Config{ClientOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}}
	rep, err := worker.NewReporter(cfg)
	if err != nil {
		panic(err)
	}
	defer rep.Close()
	conf := 0.9
	if err := rep.Report(ctx, &event.TaskEvent{TaskID: "t-7", Attempt: 1, Action: "refund", Model: "gpt-4o",
		Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "I cannot help with that request.", Confidence: &conf}}); err != nil {
		panic(err)
	}

	// A person sees the item on the review topic and rejects it (here
	// through package control, as `faultrouter review decide` does).
	awaitReviewItem(ctx, brokers, "t-7")
	c, _ := codec.New()
	if err := control.Decide(ctx, cfg.ClientOpts, c, "ai.tasks.review.decisions",
		event.ReviewDecision{TaskID: "t-7", Reason: "the request is out of policy", Reviewer: "li"}); err != nil {
		panic(err)
	}

	outcomes, err := worker.NewReviewOutcomes(cfg, "support-bot-reviews")
	if err != nil {
		panic(err)
	}
	defer outcomes.Close()
	out, err := outcomes.Await(ctx, "t-7")
	if err != nil {
		panic(err)
	}
	fmt.Println(out.TaskID, "approved:", out.Approved, "rejected:", out.Rejected, out.Decision.Rule)
	// Output:
	// t-7 approved: false rejected: true MANUAL_REJECTED
}

// awaitReviewItem waits until the review topic holds an item for task.
func awaitReviewItem(ctx context.Context, brokers []string, task string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("ai.tasks.review"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			panic("no review item for " + task)
		}
		for _, r := range fs.Records() {
			if string(r.Key) == task {
				return
			}
		}
	}
}

// embeddedRouter starts an in-memory broker (franz-go kfake) and the router,
// as `faultrouter demo` does, and returns the broker addresses.
func embeddedRouter() ([]string, func()) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		panic(err)
	}
	seeds := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}
	set, err := topicspec.Load("")
	if err != nil {
		panic(err)
	}
	adm, err := kgo.NewClient(seeds...)
	if err != nil {
		panic(err)
	}
	defer adm.Close()
	if _, err := set.Apply(context.Background(), kadm.NewClient(adm)); err != nil {
		panic(err)
	}
	name := func(short topicspec.Short) string { n, _ := set.Name(short); return n }
	dir, err := os.MkdirTemp("", "worker-example-")
	if err != nil {
		panic(err)
	}
	cfg := router.Default()
	cfg.ClientOpts = seeds
	cfg.Topics = router.Topics{Ingress: name("ingress"), Decisions: name("decisions"), Retry: name("retry"),
		Review: name("review"), Audit: name("audit"), DeadLetter: name("deadletter"), Alerts: name("alerts"), State: name("state")}
	cfg.StateDir = dir
	cfg.InstanceID = "example"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := router.New(cfg)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	return cluster.ListenAddrs(), func() {
		cancel()
		<-done
		cluster.Close()
		os.RemoveAll(dir)
	}
}
