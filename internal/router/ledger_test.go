package router

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Guards the cost ledger's metrics and audit records: every decided
// attempt's cost by class and route and by provider/model and outcome, a
// redelivery never counted twice, and the cost a dead letter prevented
// against the policy's baseline (here 5 retries: 3 more attempts after 3, at
// the task's mean attempt cost of $0.02), counted by class and stop and
// carried by the dead letter's audit record.
func TestLedgerMetrics(t *testing.T) {
	p := policy.Default()
	p.CostPrevented.BaselineRetries = 5
	reg, topics, seeds := newTestRouterWith(t, func(c *Config) { c.Policy = p })
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute)
	mk := func(id, task string, sec int, cost float64, status event.Status, e *event.Error) *kgo.Record {
		ev := event.TaskEvent{EventID: id, TaskID: task, Attempt: 1, OccurredAt: event.At(t0.Add(time.Duration(sec) * time.Second)),
			Source: "unit", Action: "answer_ticket", Provider: "openai", Model: "gpt-4o", PromptTemplate: "ticket-v1",
			Stage: event.StageNetwork, Status: status, Error: e, Usage: event.Usage{CostUSD: cost, Tokens: 100, ElapsedMs: 500}}
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: topics.Ingress, Key: []byte(task), Value: v}
	}
	timeout := &event.Error{Type: "TimeoutError", HTTPStatus: 504}
	recs := []*kgo.Record{
		mk("n-1", "t-net", 0, 0.01, event.StatusError, timeout),
		mk("n-2", "t-net", 2, 0.02, event.StatusError, timeout),
		mk("n-3", "t-net", 6, 0.03, event.StatusError, timeout),
		mk("o-1", "t-ok", 0, 0.05, event.StatusOK, nil),
		mk("o-1", "t-ok", 0, 0.05, event.StatusOK, nil), // redelivery: not an attempt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for sample(t, reg, "faultrouter_redeliveries_dropped_total", nil)+sample(t, reg, "faultrouter_spend_usd_total",
		map[string]string{"class": "NETWORK_TIMEOUT", "route": "DEADLETTER"}) < 1.03 {
		if ctx.Err() != nil {
			t.Fatal("timed out waiting for the dead letter and the redelivery")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"faultrouter_spend_usd_total", map[string]string{"class": "NETWORK_TIMEOUT", "route": "RETRY"}, 0.03},
		{"faultrouter_spend_usd_total", map[string]string{"class": "NETWORK_TIMEOUT", "route": "DEADLETTER"}, 0.03},
		{"faultrouter_spend_usd_total", map[string]string{"class": "SUCCEEDED", "route": "COMPLETE"}, 0.05},
		{"faultrouter_spend_tokens_total", map[string]string{"class": "SUCCEEDED", "route": "COMPLETE"}, 100},
		{"faultrouter_spend_elapsed_seconds_total", map[string]string{"class": "NETWORK_TIMEOUT", "route": "RETRY"}, 1},
		{"faultrouter_spend_by_model_usd_total", map[string]string{"provider_model": "openai/gpt-4o", "outcome": "failed"}, 0.06},
		{"faultrouter_spend_by_model_usd_total", map[string]string{"provider_model": "openai/gpt-4o", "outcome": "succeeded"}, 0.05},
		{"faultrouter_spend_by_template_usd_total", map[string]string{"prompt_template": "ticket-v1", "outcome": "failed"}, 0.06},
		{"faultrouter_cost_prevented_usd_total", map[string]string{"class": "NETWORK_TIMEOUT", "stop": "dead_letter"}, 0.06},
		{"faultrouter_cost_prevented_attempts_total", map[string]string{"class": "NETWORK_TIMEOUT", "stop": "dead_letter"}, 3},
		{"faultrouter_cost_prevented_by_key_usd_total", map[string]string{"scope": "provider_model", "key": "openai/gpt-4o"}, 0.06},
	} {
		if got := sample(t, reg, c.name, c.labels); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	ccl, err := kgo.NewClient(append(seeds, kgo.ConsumeTopics(topics.Audit), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer ccl.Close()
	var audited []event.Decision
	for len(audited) < len(recs) && ctx.Err() == nil {
		ccl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			r, err := c.DecodeRouted(rec.Value)
			if err != nil {
				t.Fatal(err)
			}
			audited = append(audited, r.Decision)
		})
	}
	for _, d := range audited {
		want := (*event.Prevented)(nil)
		if d.Route == event.RouteDeadLetter {
			want = &event.Prevented{Stop: "dead_letter", BaselineRetries: 5, Attempts: 3, USD: 0.06}
		}
		if (d.Prevented == nil) != (want == nil) || want != nil && *d.Prevented != *want {
			t.Errorf("audit of %s/%s carries prevented %+v, want %+v", d.Class, d.Route, d.Prevented, want)
		}
	}
	if len(audited) != len(recs) {
		t.Errorf("%d audit records, want %d", len(audited), len(recs))
	}
}

// Guards the bounded label sets: past the bound every new key is "other",
// and the keys seen before keep their names.
func TestBoundedLedgerKeys(t *testing.T) {
	b := boundedKeys{max: 3}
	for i := range 3 {
		if got := b.label(fmt.Sprint("k", i)); got != fmt.Sprint("k", i) {
			t.Fatalf("key %d labelled %q", i, got)
		}
	}
	if got := b.label("k9"); got != otherKey {
		t.Errorf("a fourth key is labelled %q, want %q", got, otherKey)
	}
	if got := b.label("k1"); got != "k1" {
		t.Errorf("a known key is labelled %q after the bound, want k1", got)
	}
}
