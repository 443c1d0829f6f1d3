package router

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// sample returns the value of the counter or histogram count name whose
// labels include all of want.
func sample(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// Guards docs/design.md's measurement contract: per-task metrics count the
// original task, never the attempt (two tasks, four attempts: two started,
// two terminal), with the terminal class and route, the time to the terminal
// decision, and the attempts' cost and tokens by class.
func TestTaskMetricsCountTasksNotAttempts(t *testing.T) {
	reg, topics, seeds := newTestRouter(t)
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute)
	mk := func(id, task string, sec int, status event.Status, e *event.Error) *kgo.Record {
		ev := event.TaskEvent{EventID: id, TaskID: task, Attempt: 1, OccurredAt: event.At(t0.Add(time.Duration(sec) * time.Second)),
			Source: "unit", Action: "answer_ticket", Stage: event.StageNetwork, Status: status, Error: e,
			Usage: event.Usage{CostUSD: 0.02, Tokens: 100}}
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: topics.Ingress, Key: []byte(task), Value: v}
	}
	timeout := &event.Error{Type: "TimeoutError", HTTPStatus: 504}
	recs := []*kgo.Record{
		mk("n-1", "t-net", 0, event.StatusError, timeout),
		mk("n-2", "t-net", 2, event.StatusError, timeout),
		mk("n-3", "t-net", 6, event.StatusError, timeout),
		mk("o-1", "t-ok", 0, event.StatusOK, nil),
		mk("o-1", "t-ok", 0, event.StatusOK, nil), // redelivery: not a task, no cost
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
	// routed_total is a vector: wait until all five inputs are counted
	total := func() float64 {
		n := 0.0
		for _, cl := range []string{"NETWORK_TIMEOUT", "SUCCEEDED"} {
			for _, rt := range []string{"RETRY", "DEADLETTER", "COMPLETE", "DROP"} {
				n += sample(t, reg, "faultrouter_routed_total", map[string]string{"class": cl, "route": rt})
			}
		}
		return n
	}
	for total() < float64(len(recs)) {
		if ctx.Err() != nil {
			t.Fatalf("timed out: %v of %d inputs routed", total(), len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"faultrouter_tasks_started_total", nil, 2},
		{"faultrouter_tasks_terminal_total", map[string]string{"class": "NETWORK_TIMEOUT", "route": "DEADLETTER"}, 1},
		{"faultrouter_tasks_terminal_total", map[string]string{"class": "SUCCEEDED", "route": "COMPLETE"}, 1},
		{"faultrouter_task_terminal_seconds", map[string]string{"class": "NETWORK_TIMEOUT"}, 1},
		{"faultrouter_tokens_total", map[string]string{"class": "NETWORK_TIMEOUT"}, 300},
		{"faultrouter_tokens_total", map[string]string{"class": "SUCCEEDED"}, 100},
	} {
		if got := sample(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
