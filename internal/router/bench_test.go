package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// BenchmarkBatching measures the router end to end on an embedded broker
// (kfake): events routed per second with one transaction and one Pebble
// batch per poll of up to Default().MaxPollRecords records, against a baseline in
// the same run that routes one record per poll (one transaction, one Pebble
// batch per record). It prints the ratio; nothing is asserted.
//
//	go test -run='^$' -bench=Batching -benchtime=1x ./internal/router
func BenchmarkBatching(b *testing.B) {
	const n = 3000
	rate := func(b *testing.B, perPoll int) float64 {
		reg, topics, seeds := newTestRouterWith(b, func(c *Config) { c.MaxPollRecords, c.MaxBatchRecords = perPoll, perPoll })
		recs := benchEvents(b, topics.Ingress, n)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cl, err := kgo.NewClient(seeds...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		start := time.Now()
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		for routedCount(b, reg) < n {
			if ctx.Err() != nil {
				b.Fatalf("routed %v of %d", routedCount(b, reg), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return n / time.Since(start).Seconds()
	}
	for i := 0; i < b.N; i++ {
		base := rate(b, 1)
		batched := rate(b, Default().MaxPollRecords)
		b.ReportMetric(base, "events/s-per-record")
		b.ReportMetric(batched, "events/s-batched")
		b.ReportMetric(batched/base, "ratio")
		fmt.Printf("router on kfake, %d events: one record per poll %.0f events/s; up to %d per poll %.0f events/s; ratio %.1fx\n",
			n, base, Default().MaxPollRecords, batched, batched/base)
	}
}

// benchEvents returns n encoded events over n/3 tasks: successes, timeouts
// (retried) and refusals (to review).
func benchEvents(b *testing.B, topic string, n int) []*kgo.Record {
	c, err := codec.New()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	recs := make([]*kgo.Record, 0, n)
	for i := 0; i < n; i++ {
		task := fmt.Sprintf("bench-%d", i/3)
		ev := event.TaskEvent{EventID: fmt.Sprintf("e-%d", i), TaskID: task, Attempt: int32(i%3 + 1),
			OccurredAt: event.At(t0), Source: "bench", Action: "answer_ticket", Provider: "p", Model: "m",
			Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}, Usage: event.Usage{CostUSD: 0.001, Tokens: 10}}
		if i%5 == 0 {
			ev.Status, ev.Error = event.StatusOK, nil
		}
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(task), Value: v})
	}
	return recs
}

func routedCount(tb testing.TB, reg *prometheus.Registry) float64 {
	fams, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() == "faultrouter_routed_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
