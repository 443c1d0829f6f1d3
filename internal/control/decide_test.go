package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards "a refused instruction is a clear error, never a hang": a review
// decision or a breaker reset for a decisions topic that does not exist (a
// wrong topic prefix) returns ErrNoTopic, which names the likely cause, from
// the topic listing that precedes the produce; the same listing returns the
// cluster's refusal of a wrong password or certificate at once, where the
// produce retried without end (tested on the real broker's SASL_SSL listener
// in integration/sasl_test.go). A decision to an existing topic is written.
func TestInstructionsFailFast(t *testing.T) {
	const topic = "ai.tasks.review.decisions"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	opts := []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	// past the test's patience, so that a hang fails instead of waiting
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := event.ReviewDecision{TaskID: "t-1", Approve: true, Reason: "right", Reviewer: "it"}

	if err := Decide(ctx, opts, c, "wrong-prefix."+topic, d); !errors.Is(err, ErrNoTopic) {
		t.Errorf("Decide to a missing topic: %v, want ErrNoTopic", err)
	}
	if _, err := ResetBreaker(ctx, opts, c, "wrong-prefix."+topic, Reset{Scope: breaker.PromptTemplate, Key: "k", Reason: "r"}); !errors.Is(err, ErrNoTopic) {
		t.Errorf("ResetBreaker on a missing topic: %v, want ErrNoTopic", err)
	}
	if ctx.Err() != nil {
		t.Fatal("an instruction waited for the context instead of failing at once")
	}
	if err := Decide(ctx, opts, c, topic, d); err != nil {
		t.Errorf("Decide to the decisions topic: %v", err)
	}
	if n, err := ResetBreaker(ctx, opts, c, topic, Reset{Scope: breaker.PromptTemplate, Key: "k", Reason: "r"}); err != nil || n != 2 {
		t.Errorf("ResetBreaker: %d partitions, %v; want 2, nil", n, err)
	}
}
