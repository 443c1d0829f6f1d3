package whatif

import (
	"cmp"
	"slices"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// BreakerRow counts the openings of one breaker (scope/key) when the
// decisions of each policy are fed, in decision time order, to one breaker
// set built from that policy's breaker settings. Estimated: the router's
// breakers live per instance and also see the probes of held retries.
type BreakerRow struct {
	Breaker   string `json:"breaker"`
	Baseline  int    `json:"baseline"`
	Candidate int    `json:"candidate"`
}

// openings feeds every decided task event's breaker outcomes
// (policy.BreakerOutcomes), the hallucination latches and the review
// decisions that reset them to a breaker set of p, in decision time order,
// and counts the transitions to OPEN per breaker.
func openings(ds []checker.Decided, p *policy.Policy) map[string]int {
	set, err := breaker.NewSet(p.Breakers.ProviderModel.Config(), p.Breakers.Downstream.Config(), p.Breakers.PromptTemplate.Config())
	if err != nil {
		return nil // a validated policy's breakers are valid
	}
	set.SetLimits(p.BreakerLimitsFunc())
	order := make([]int, len(ds))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(ds[a].At.UnixMilli(), ds[b].At.UnixMilli()) })
	out := map[string]int{}
	count := func(ts []breaker.Transition) {
		for _, t := range ts {
			if t.To == breaker.Open {
				out[t.Ref.String()]++
			}
		}
	}
	last := map[string]*event.TaskEvent{}
	for _, i := range order {
		d := &ds[i]
		m := &d.Model
		if m.Route == "" || m.Route == event.RouteDrop {
			continue
		}
		if d.Event == nil {
			if ref, ok := policy.ReviewResetsTemplate(m, last[d.Task]); ok {
				count(set.Reset(ref, "reviewed", d.At))
			}
			continue
		}
		last[d.Task] = d.Event
		for _, o := range policy.BreakerOutcomes(d.Event, m.Class) {
			count(set.Record(o, d.At))
		}
		if ref, ok := policy.LatchesTemplate(d.Event, m.Class); ok {
			count(set.Trip(ref, "hallucination", breaker.Outcome{Ref: ref, Failure: true, Class: string(m.Class), TaskID: d.Task}, d.At))
		}
	}
	return out
}

// breakerRows lists the breakers that open under either policy.
func breakerRows(base, cand []checker.Decided, o Options) []BreakerRow {
	b, c := openings(base, o.Baseline), openings(cand, o.Candidate)
	rows := map[string]*BreakerRow{}
	for k, n := range b {
		rows[k] = &BreakerRow{Breaker: k, Baseline: n}
	}
	for k, n := range c {
		if rows[k] == nil {
			rows[k] = &BreakerRow{Breaker: k}
		}
		rows[k].Candidate = n
	}
	out := make([]BreakerRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b BreakerRow) int { return cmp.Compare(a.Breaker, b.Breaker) })
	return out
}
