package advise

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

var t0 = time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)

// decideAll decides a stream's events, then its review decisions, with the
// router's own decision code and p, as the audit would record them; a
// task's inputs stay in order.
func decideAll(p *policy.Policy, a workload.Advice) []Input {
	states := map[string]*task.State{}
	state := func(id string) *task.State {
		if states[id] == nil {
			states[id] = new(task.State)
		}
		return states[id]
	}
	var out []Input
	for i := range a.Events {
		ev := &a.Events[i]
		st := state(ev.TaskID)
		var d event.Decision
		if st.Seen(ev.EventID) {
			d = p.Drop(ev, st, ev.OccurredAt.Time)
		} else {
			d = p.Decide(ev, st, ev.OccurredAt.Time)
		}
		out = append(out, Input{Task: ev.TaskID, Event: ev, Decision: d})
	}
	for i := range a.Decisions {
		rd := &a.Decisions[i]
		out = append(out, Input{Task: rd.TaskID, Review: rd, Decision: p.DecideReview(rd, state(rd.TaskID), rd.At.Time)})
	}
	return out
}

func byKind(ps []Proposal) map[string]Proposal {
	m := map[string]Proposal{}
	for _, p := range ps {
		m[p.Kind] = p
	}
	return m
}

// TestTheStreamsTruthIsProposed guards the advisor's point: on the
// workload's stream whose truth is known (a provider whose timeouts never
// clear after the first retry, a model whose refusals at confidence
// 0.65-0.75 reviewers approve 90% of the time, an owner who answers in 2 h
// against a 30 min SLA) it proposes exactly those three changes, at the
// matches the truth names, each with an interval that holds the truth.
func TestTheStreamsTruthIsProposed(t *testing.T) {
	p := policy.Default()
	r := Analyze(decideAll(p, workload.AdviceStream("adv", t0, true)), Options{Policy: p})
	if len(r.Proposals) != 3 {
		t.Fatalf("%d proposals, want 3: %+v", len(r.Proposals), r.Proposals)
	}
	k := byKind(r.Proposals)

	mr := k[KindMaxRetries]
	if mr.Class != event.ClassNetworkTimeout || mr.Match == nil || *mr.Match != (Match{workload.StuckProvider, "*", "*", "*"}) ||
		mr.Change.From != 2 || mr.Change.To != 1 {
		t.Errorf("max_retries proposal %+v %v %+v, want network_timeout 2 -> 1 for provider %s", mr.Class, mr.Match, mr.Change, workload.StuckProvider)
	}
	if ev := mr.Evidence; ev.Count != 40 || ev.Hits != 0 || !ev.Interval.Holds(0) || ev.Interval.Hi >= 0.15 {
		t.Errorf("max_retries evidence %+v: want 0 of 40 second retries, an interval holding 0 under 15%%", ev)
	}
	if len(mr.Retries) != 2 || mr.Retries[0].Success.Rate != 0.5 || mr.Retries[0].MeanDelayMs != 3000 {
		t.Errorf("max_retries plot %+v: want retries 1 and 2, the first succeeding half the time after 3 s", mr.Retries)
	}

	mc := k[KindMinConfidence]
	if mc.Match == nil || *mc.Match != (Match{workload.TrustedProvider, workload.TrustedModel, "*", "*"}) || mc.Change.From != 0.75 || mc.Change.To != workload.TrustedFrom {
		t.Errorf("min_confidence proposal %v %+v, want 0.75 -> %v for %s/%s", mc.Match, mc.Change, workload.TrustedFrom, workload.TrustedProvider, workload.TrustedModel)
	}
	if ev := mc.Evidence; ev.Count != 80 || !ev.Interval.Holds(workload.TrustedApproval) || ev.Interval.Lo < 0.7 {
		t.Errorf("min_confidence evidence %+v: want 80 items, an interval holding %v", ev, workload.TrustedApproval)
	}
	if len(mc.Bands) != 2 || mc.Bands[0].From != 0.65 || mc.Bands[1].To != 0.75 {
		t.Errorf("min_confidence plot %+v: want the bands 0.65-0.70 and 0.70-0.75", mc.Bands)
	}

	sla := k[KindOwnerSLA]
	truth := float64(workload.SlowWait.Milliseconds())
	if sla.Owner != workload.SlowOwner || sla.Match != nil || sla.Change.From != float64(30*time.Minute/time.Millisecond) || sla.Change.To < truth {
		t.Errorf("SLA proposal %q %+v, want %s's 30 min raised to at least 2 h", sla.Owner, sla.Change, workload.SlowOwner)
	}
	if ev := sla.Evidence; ev.Count != 40 || !ev.Interval.Holds(truth) {
		t.Errorf("SLA evidence %+v: want the median wait of 40 items, its interval holding 2 h", ev)
	}
	if len(sla.Hist) == 0 || sla.BucketMs <= 0 {
		t.Errorf("SLA plot: histogram %v of %d ms buckets", sla.Hist, sla.BucketMs)
	}
}

// TestNoPatternNoProposal guards against proposals from nothing: the same
// tasks with the truth turned the other way (second retries that help 40%
// of the time, refusals reviewers approve 40% of the time, an owner within
// its SLA), and the truth's stream cut to a handful of tasks of each kind,
// propose nothing.
func TestNoPatternNoProposal(t *testing.T) {
	p := policy.Default()
	if r := Analyze(decideAll(p, workload.AdviceStream("adv", t0, false)), Options{Policy: p}); len(r.Proposals) != 0 {
		t.Errorf("the stream without the patterns: %d proposals, want none: %+v", len(r.Proposals), r.Proposals)
	}
	a := workload.AdviceStream("adv", t0, true)
	few := func(id string) bool { return strings.HasSuffix(id, "-00"+id[len(id)-1:]) } // tasks 000-009 of each kind
	var cut workload.Advice
	for _, e := range a.Events {
		if few(e.TaskID) {
			cut.Events = append(cut.Events, e)
		}
	}
	for _, d := range a.Decisions {
		if few(d.TaskID) {
			cut.Decisions = append(cut.Decisions, d)
		}
	}
	if len(cut.Events) == 0 || len(cut.Decisions) == 0 {
		t.Fatal("the cut stream is empty: the test would prove nothing")
	}
	if r := Analyze(decideAll(p, cut), Options{Policy: p}); len(r.Proposals) != 0 {
		t.Errorf("a handful of tasks of each pattern: %d proposals, want none: %+v", len(r.Proposals), r.Proposals)
	}
}

// TestRaiseMaxRetries guards the other direction: every retry of a class
// succeeding at least half the time while tasks still run out of them
// proposes one retry more; a shared budget with no room proposes nothing.
func TestRaiseMaxRetries(t *testing.T) {
	var in []Input
	pm := [2]string{"zeta", "z-1"}
	for i := range 120 {
		id := "raise-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		// attempt 1 times out; retry 1 succeeds 2 in 3; retry 2 succeeds
		// 2 in 3 of the rest; the rest run out
		outcomes := []event.Route{event.RouteRetry}
		switch i % 9 {
		case 0, 1, 2, 3, 4, 5:
			outcomes = append(outcomes, event.RouteComplete)
		case 6, 7:
			outcomes = append(outcomes, event.RouteRetry, event.RouteComplete)
		default:
			outcomes = append(outcomes, event.RouteRetry, event.RouteDeadLetter)
		}
		for n, route := range outcomes {
			ev := &event.TaskEvent{TaskID: id, EventID: id + "-" + string(rune('1'+n)), Attempt: int32(n + 1), Provider: pm[0], Model: pm[1],
				OccurredAt: event.At(t0.Add(time.Duration(i*10+n) * time.Second))}
			d := event.Decision{Class: event.ClassNetworkTimeout, Route: route}
			if route == event.RouteComplete {
				d.Class = event.ClassSucceeded
			}
			in = append(in, Input{Task: id, Event: ev, Decision: d})
		}
	}
	p := policy.Default()
	r := Analyze(in, Options{Policy: p, MinCount: 10})
	if len(r.Proposals) != 1 || r.Proposals[0].Change.To != 3 || r.Proposals[0].Match.Model != "z-1" {
		t.Fatalf("proposals %+v, want one: network_timeout.max_retries 2 -> 3 for zeta/z-1", r.Proposals)
	}
	p.RetryBudget = 2
	if r := Analyze(in, Options{Policy: p, MinCount: 10}); len(r.Proposals) != 0 {
		t.Errorf("retry budget 2: proposals %+v, want none (no room for a third retry)", r.Proposals)
	}
}

// TestWilson guards the interval the proposals state, against values
// computed by hand.
func TestWilson(t *testing.T) {
	for _, c := range []struct {
		k, n   int
		lo, hi float64
	}{{0, 40, 0, 0.0876}, {36, 40, 0.7695, 0.9604}, {20, 40, 0.3520, 0.6480}, {0, 0, 0, 1}} {
		got := wilson(c.k, c.n)
		if math.Abs(got.Lo-c.lo) > 1e-4 || math.Abs(got.Hi-c.hi) > 1e-4 {
			t.Errorf("wilson(%d, %d) = %+v, want [%v, %v]", c.k, c.n, got, c.lo, c.hi)
		}
	}
}

// TestALaterRetryThatHelpsKeepsTheEarlierOne guards lowering max_retries:
// retry 1 never succeeding is no reason to stop at 0 when retry 2 succeeds
// nine times in ten (a first retry that fails and sets up a second is not
// useless); when every later retry fails too, max_retries is lowered.
func TestALaterRetryThatHelpsKeepsTheEarlierOne(t *testing.T) {
	o := Options{MinCount: 30, UselessBelow: 0.15}
	m := Match{"acme", "*", "*", "*"}
	row := func(n, k, of int) RetryRow { return RetryRow{N: n, Success: rateOf(k, of)} }
	if p, ok := lowerRetries(event.ClassNetworkTimeout, m, 3, []RetryRow{row(1, 0, 100), row(2, 90, 100), row(3, 5, 10)}, o); ok {
		t.Errorf("proposed %s, though retry 2 succeeded 90 of 100 times", p.Change.Text)
	}
	p, ok := lowerRetries(event.ClassNetworkTimeout, m, 3, []RetryRow{row(1, 40, 100), row(2, 0, 60), row(3, 1, 60)}, o)
	if !ok || p.Change.To != 1 {
		t.Errorf("got %+v (%v), want max_retries 3 -> 1: retries 2 and 3 never help", p.Change, ok)
	}
	// a later retry measured too few times says nothing either way
	if p, ok := lowerRetries(event.ClassNetworkTimeout, m, 3, []RetryRow{row(1, 0, 100), row(2, 3, 5)}, o); !ok || p.Change.To != 0 {
		t.Errorf("got %+v (%v), want max_retries 3 -> 0", p.Change, ok)
	}
}
