package control

import (
	"context"
	"errors"
	"strings"
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
	const topic, breakers = "ai.tasks.review.decisions", "faultrouter.breakers"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.SeedTopics(1, breakers))
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
	if _, err := ResetBreaker(ctx, opts, c, Topics{Decisions: "wrong-prefix." + topic, Breakers: breakers}, Reset{Scope: breaker.PromptTemplate, Key: "k", Reason: "r"}); !errors.Is(err, ErrNoTopic) {
		t.Errorf("ResetBreaker on a missing topic: %v, want ErrNoTopic", err)
	}
	if ctx.Err() != nil {
		t.Fatal("an instruction waited for the context instead of failing at once")
	}
	if err := Decide(ctx, opts, c, topic, d); err != nil {
		t.Errorf("Decide to the decisions topic: %v", err)
	}
	if n, err := ResetBreaker(ctx, opts, c, Topics{Decisions: topic, Breakers: breakers}, Reset{Scope: breaker.PromptTemplate, Key: "k", Reason: "r", Operator: "ops"}); err != nil || n != 2 {
		t.Errorf("ResetBreaker: %d partitions, %v; want 2, nil", n, err)
	}
	if n, err := LatchBreaker(ctx, opts, c, Topics{Decisions: topic, Breakers: breakers}, Latch{Scope: breaker.PromptTemplate, Key: "k", Reason: "r", Operator: "ops"}); err != nil || n != 2 {
		t.Errorf("LatchBreaker: %d partitions, %v; want 2, nil", n, err)
	}
	if _, err := LatchBreaker(ctx, opts, c, Topics{Decisions: topic, Breakers: breakers}, Latch{Scope: breaker.PromptTemplate, Key: "k", Operator: "ops"}); !errors.Is(err, ErrMissing) {
		t.Errorf("LatchBreaker without a reason: %v, want ErrMissing", err)
	}

	// what the routers read, committed: the RESET record, then the latch
	// item, on the breakers topic; each command on both decisions partitions
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic, breakers), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var keys []string
	commands := 0
	for len(keys) < 2 || commands < 4 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %v on the breakers topic and %d commands, want 2 and 4", keys, commands)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == breakers {
				keys = append(keys, string(r.Key))
			} else {
				commands++
			}
		})
	}
	if keys[0] != event.BreakerResetKey("PROMPT_TEMPLATE", "k") || !strings.HasPrefix(keys[1], event.BreakerItemPrefix+"PROMPT_TEMPLATE/latch:ops:") {
		t.Errorf("breakers topic keys %v, want the RESET, then the latch item", keys)
	}
}
