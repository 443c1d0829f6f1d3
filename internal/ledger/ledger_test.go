package ledger

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// TestLedgerSums guards the ledger's contract: the total is the sum of
// usage.cost_usd of every decided attempt (a redelivery once), split exactly
// into failed (not SUCCEEDED) and successful spend and into rows per class,
// provider/model, template and owner that add up to it; cost prevented is
// the policy's for each stop.
func TestLedgerSums(t *testing.T) {
	p := policy.Default()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := func(task, id string, cost float64, status event.Status, er *event.Error) event.TaskEvent {
		return event.TaskEvent{EventID: id, TaskID: task, Attempt: 1, OccurredAt: event.At(at), Provider: "openai", Model: "gpt-4o",
			PromptTemplate: "tmpl-" + task, Stage: event.StageNetwork, Status: status, Error: er,
			Usage: event.Usage{CostUSD: cost, Tokens: 100, ElapsedMs: 1000}}
	}
	timeout := &event.Error{Type: "TimeoutError", HTTPStatus: 504}
	events := []event.TaskEvent{
		ev("a", "a1", 0.01, event.StatusError, timeout),
		ev("a", "a1", 0.01, event.StatusError, timeout), // redelivery: DROP
		ev("a", "a2", 0.02, event.StatusError, timeout),
		ev("a", "a3", 0.03, event.StatusError, timeout), // third timeout: dead letter
		ev("b", "b1", 0.05, event.StatusOK, nil),
	}
	l := New(p)
	states := map[string]*task.State{}
	for i := range events {
		e := &events[i]
		st := states[e.TaskID]
		if st == nil {
			st = &task.State{}
			states[e.TaskID] = st
		}
		var d event.Decision
		if st.Seen(e.EventID) {
			d = p.Drop(e, st, at)
		} else {
			d = p.Decide(e, st, at)
		}
		l.Add(e, &d, "")
	}
	r := l.Report()
	// the dead letter after 3 attempts ($0.06): the baseline's 4th attempt at $0.02
	if r.Attempts != 4 || r.TotalUSD != 0.11 || r.FailedUSD != 0.06 || r.SucceededUSD != 0.05 || r.PreventedUSD != 0.02 {
		t.Fatalf("report %+v: want 4 attempts, $0.11 = $0.06 failed + $0.05 succeeded, $0.02 prevented", r)
	}
	for name, rows := range map[string][]Row{"classes": r.Classes, "routes": r.Routes, "models": r.Models, "templates": r.Templates, "owners": r.Owners} {
		var sum int64
		for _, x := range rows {
			sum += Micros(x.CostUSD)
		}
		if sum != Micros(r.TotalUSD) {
			t.Errorf("%s rows add up to %d micro-dollars, want %d", name, sum, Micros(r.TotalUSD))
		}
	}
	if len(r.Prevented) != 1 || r.Prevented[0].Key != "dead_letter" || r.Prevented[0].Stops != 1 || r.Prevented[0].PreventedAttempts != 1 {
		t.Errorf("prevented rows %+v, want one dead_letter stop avoiding 1 attempt", r.Prevented)
	}
	var out bytes.Buffer
	if err := r.WriteTable(&out, 10); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"$0.11", "NETWORK_TIMEOUT", "openai/gpt-4o", "dead_letter", "cost prevented"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
