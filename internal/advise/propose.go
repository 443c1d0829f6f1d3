package advise

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Kinds of proposal.
const (
	KindMaxRetries    = "max_retries"
	KindMinConfidence = "min_confidence"
	KindOwnerSLA      = "sla_ms"
)

// Proposal is one change the range supports, with its evidence and the
// data of its plot.
type Proposal struct {
	// Name is the override's name in the candidate policy (the owner's ID
	// for an SLA).
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Class is the failure class whose section changes; empty for an SLA.
	Class event.Class `json:"class,omitempty"`
	// Match selects the events the change applies to; nil for an owner's
	// SLA, which is the owner's.
	Match *Match `json:"match"`
	// Owner is the review owner whose SLA changes.
	Owner    string   `json:"owner,omitempty"`
	Change   Change   `json:"change"`
	Evidence Evidence `json:"evidence"`
	// Retries is the success by retry number of the match and class (a
	// max_retries proposal's plot).
	Retries []RetryRow `json:"retries,omitempty"`
	// Bands is the approval rate by confidence band of the match's
	// refusals (a min_confidence proposal's plot).
	Bands []BandRow `json:"bands,omitempty"`
	// Hist counts the owner's answered items by wait, in buckets of
	// BucketMs (an SLA proposal's plot).
	Hist     []int `json:"wait_histogram,omitempty"`
	BucketMs int64 `json:"bucket_ms,omitempty"`
}

// Change is what a proposal changes: Section.Key from From to To (in the
// policy file's units).
type Change struct {
	Section string  `json:"section"`
	Key     string  `json:"key"`
	From    float64 `json:"from"`
	To      float64 `json:"to"`
	// Text says it for a person.
	Text string `json:"text"`
}

// Evidence is what a proposal rests on: a measure over Count observations
// (Hits of them the event measured, for a rate), its value and 95%
// interval, and a sentence.
type Evidence struct {
	Measure  string   `json:"measure"`
	Count    int      `json:"count"`
	Hits     int      `json:"hits"`
	Value    float64  `json:"value"`
	Interval Interval `json:"interval"`
	Text     string   `json:"text"`
}

// propose turns the tallies into proposals.
func propose(t *tallies, o Options) []Proposal {
	var out []Proposal
	out = append(out, proposeRetries(t, o)...)
	out = append(out, proposeConfidence(t, o, out)...)
	out = append(out, proposeSLA(t, o)...)
	names := map[string]int{}
	for i := range out {
		if out[i].Kind == KindOwnerSLA {
			continue
		}
		base := out[i].Name
		if names[base]++; names[base] > 1 {
			out[i].Name = base + "-" + strconv.Itoa(names[base])
		}
	}
	return out
}

// matchesOf lists the matches of tallied keys, broadest first.
func matchesOf[K comparable](m map[K]bool, match func(K) Match) []K {
	var ks []K
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b K) int {
		ma, mb := match(a), match(b)
		return cmp.Or(cmp.Compare(ma.depth(), mb.depth()), cmp.Compare(ma.String(), mb.String()))
	})
	return ks
}

// redundant reports whether a proposal at m would say nothing a narrower
// one would not: m was seen with a single narrower match only.
func redundant(children map[Match]bool) bool { return len(children) == 1 }

// covered reports whether a proposal of kind and class at a match holding m
// was made already.
func covered(out []Proposal, kind string, class event.Class, m Match) bool {
	for _, p := range out {
		if p.Kind == kind && p.Class == class && p.Match != nil && p.Match.contains(m) {
			return true
		}
	}
	return false
}

// ties reports whether a proposal at m would tie with a match the
// candidate file holds: a proposal made, or an override of the running
// policy, as specific and able to select the same events (a
// provider/model's action and its template), which a policy file may not
// hold. A match equal to m does not tie: the candidate writes the key into
// that entry.
func ties(out []Proposal, running []policy.Override, m Match) bool {
	tie := func(o Match) bool { return o != m && o.depth() == m.depth() && o.overlaps(m) }
	for _, p := range out {
		if p.Match != nil && tie(*p.Match) {
			return true
		}
	}
	for i := range running {
		if secs := running[i].Sections(); !slices.Equal(secs, []string{"breakers"}) && tie(policyMatch(running[i].Match)) {
			return true // an override of breaker limits alone decides no event: no tie
		}
	}
	return false
}

func proposeRetries(t *tallies, o Options) []Proposal {
	type cm struct {
		class event.Class
		match Match
	}
	seen := map[cm]bool{}
	for k := range t.retries {
		seen[cm{k.class, k.match}] = true
	}
	var out []Proposal
	for _, g := range matchesOf(seen, func(k cm) Match { return k.match }) {
		cur, ok := maxRetries(o.Policy, g.class, t.first[g.match])
		if !ok || covered(out, KindMaxRetries, g.class, g.match) || redundant(t.children[retryKey{class: g.class, match: g.match}]) || ties(out, o.Policy.Overrides, g.match) {
			continue
		}
		curve := curveOf(t, g.class, g.match)
		if p, ok := lowerRetries(g.class, g.match, cur, curve, o); ok {
			out = append(out, p)
		} else if p, ok := raiseRetries(t, g.class, g.match, cur, curve, o); ok {
			out = append(out, p)
		}
	}
	return out
}

// curveOf is the success by retry number of class at match, retry 1 first.
func curveOf(t *tallies, class event.Class, m Match) []RetryRow {
	var rows []RetryRow
	for n := 1; ; n++ {
		x := t.retries[retryKey{class, m, n}]
		if x == nil {
			return rows
		}
		rows = append(rows, retryRow(retryKey{class, m, n}, x))
	}
}

// lowerRetries proposes max_retries n-1 at the first retry n that does not
// help, when no later retry the range measured helps either (a retry that
// fails but sets up one that succeeds is not useless).
func lowerRetries(class event.Class, m Match, cur int32, curve []RetryRow, o Options) (Proposal, bool) {
	for i, row := range curve {
		if row.N > int(cur) || row.Success.N < o.MinCount {
			break
		}
		if row.Success.Interval.Hi >= o.UselessBelow {
			continue
		}
		for _, later := range curve[i+1:] {
			if later.N <= int(cur) && later.Success.N >= o.MinCount && later.Success.Interval.Hi >= o.UselessBelow {
				return Proposal{}, false
			}
		}
		to := row.N - 1
		s := row.Success
		return Proposal{
			Name: overrideName(m, class), Kind: KindMaxRetries, Class: class, Match: &m,
			Change: Change{Section: section(class), Key: "max_retries", From: float64(cur), To: float64(to),
				Text: fmt.Sprintf("%s.max_retries %d -> %d for %s", section(class), cur, to, m)},
			Evidence: Evidence{Measure: fmt.Sprintf("success rate of retry %d", row.N), Count: s.N, Hits: s.K, Value: s.Rate, Interval: s.Interval,
				Text: fmt.Sprintf("retry %d of %s for %s succeeded %d of %d times (%s, 95%% interval %s): below %s, it does not help; each one cost %s on average",
					row.N, class, m, s.K, s.N, pct(s.Rate), pcts(s.Interval), pct(o.UselessBelow), dollars(row.MeanCostUSD))},
			Retries: curve,
		}, true
	}
	return Proposal{}, false
}

// raiseRetries proposes max_retries cur+1 when every retry helps at least
// half the time, enough tasks still ran out of them, and the shared budget
// has room for one more.
func raiseRetries(t *tallies, class event.Class, m Match, cur int32, curve []RetryRow, o Options) (Proposal, bool) {
	if cur < 1 || len(curve) < int(cur) || cur+1 > o.Policy.RetryBudget {
		return Proposal{}, false
	}
	for _, row := range curve[:cur] {
		if row.Success.N < o.MinCount || row.Success.Interval.Lo < 0.5 {
			return Proposal{}, false
		}
	}
	ran := t.exhausted[retryKey{class: class, match: m}]
	if ran < o.MinCount {
		return Proposal{}, false
	}
	last := curve[cur-1].Success
	return Proposal{
		Name: overrideName(m, class), Kind: KindMaxRetries, Class: class, Match: &m,
		Change: Change{Section: section(class), Key: "max_retries", From: float64(cur), To: float64(cur + 1),
			Text: fmt.Sprintf("%s.max_retries %d -> %d for %s", section(class), cur, cur+1, m)},
		Evidence: Evidence{Measure: fmt.Sprintf("success rate of retry %d", cur), Count: last.N, Hits: last.K, Value: last.Rate, Interval: last.Interval,
			Text: fmt.Sprintf("every retry of %s for %s succeeded at least half the time (retry %d: %d of %d, 95%% interval %s), and %d tasks still ran out of retries",
				class, m, cur, last.K, last.N, pcts(last.Interval), ran)},
		Retries: curve,
	}, true
}

func proposeConfidence(t *tallies, o Options, before []Proposal) []Proposal {
	seen := map[Match]bool{}
	children := map[Match]map[Match]bool{}
	for m := range t.lowConf {
		seen[m] = true
		if m.depth() >= 2 {
			if children[m.parent()] == nil {
				children[m.parent()] = map[Match]bool{}
			}
			children[m.parent()][m] = true
		}
	}
	var out []Proposal
	for _, m := range matchesOf(seen, func(m Match) Match { return m }) {
		if covered(out, KindMinConfidence, event.ClassModelRefusal, m) || redundant(children[m]) || ties(append(before, out...), o.Policy.Overrides, m) {
			continue
		}
		cur := minConfidence(o.Policy, t.first[m])
		top := bandOf(cur) - 1
		if bandEdge(top+1) < cur { // cur inside a band: that band's lower part
			top = bandOf(cur)
		}
		bands := t.lowConf[m]
		lowest, k, n := -1, 0, 0
		for b := top; b >= 0; b-- {
			x := bands[b]
			if x == nil || x[1] < max(o.MinCount/3, 1) || wilson(x[0], x[1]).Lo < o.ApproveAbove {
				break
			}
			lowest, k, n = b, k+x[0], n+x[1]
		}
		if lowest < 0 || n < o.MinCount {
			continue
		}
		to := bandEdge(lowest)
		if to >= cur {
			continue
		}
		r := rateOf(k, n)
		p := Proposal{
			Name: overrideName(m, event.ClassModelRefusal), Kind: KindMinConfidence, Class: event.ClassModelRefusal, Match: &m,
			Change: Change{Section: "model_refusal", Key: "min_confidence", From: cur, To: to,
				Text: fmt.Sprintf("model_refusal.min_confidence %v -> %v for %s", cur, to, m)},
			Evidence: Evidence{Measure: fmt.Sprintf("approval rate of refusals at confidence %v-%v", to, cur), Count: n, Hits: k, Value: r.Rate, Interval: r.Interval,
				Text: fmt.Sprintf("reviewers approved %d of %d refusals of %s at confidence %v-%v (%s, 95%% interval %s): they are answers, not refusals",
					k, n, m, to, cur, pct(r.Rate), pcts(r.Interval))},
		}
		for b := 0; b <= top; b++ {
			if x := bands[b]; x != nil {
				p.Bands = append(p.Bands, bandRow(bandKey{class: event.ClassModelRefusal, match: m, band: b}, x))
			}
		}
		out = append(out, p)
	}
	return out
}

func proposeSLA(t *tallies, o Options) []Proposal {
	owners := map[string][]int64{}
	for k, w := range t.waits {
		owners[k.owner] = append(owners[k.owner], w...)
	}
	var names []string
	for o := range owners {
		names = append(names, o)
	}
	slices.Sort(names)
	var out []Proposal
	for _, owner := range names {
		waits := owners[owner]
		cur := o.Policy.Owners[owner].SLAMs
		s := summarise(waits, cur)
		if s.N < o.MinCount || s.WithinSLA.Interval.Hi >= 0.5 {
			continue
		}
		to := ceilMinute(s.P90Ms)
		if to <= cur {
			continue
		}
		p := Proposal{
			Name: owner, Kind: KindOwnerSLA, Owner: owner,
			Change: Change{Section: "owners." + owner, Key: "sla_ms", From: float64(cur), To: float64(to),
				Text: fmt.Sprintf("owners.%s.sla_ms %s -> %s", owner, dur(cur), dur(to))},
			Evidence: Evidence{Measure: "median wait (ms)", Count: s.N, Value: float64(s.MedianMs), Interval: Interval{float64(s.MedianLoMs), float64(s.MedianHiMs)},
				Text: fmt.Sprintf("reviewers of %s answered %d items in %s at the median (95%% interval %s-%s), 90%% within %s; %d of %d (%s, 95%% interval %s) within the SLA of %s",
					owner, s.N, dur(s.MedianMs), dur(s.MedianLoMs), dur(s.MedianHiMs), dur(s.P90Ms), s.WithinSLA.K, s.N, pct(s.WithinSLA.Rate), pcts(s.WithinSLA.Interval), dur(cur))},
		}
		p.Hist, p.BucketMs = histogram(waits, max(to, cur))
		out = append(out, p)
	}
	return out
}

// histogram counts waits in 12 buckets reaching past top.
func histogram(waits []int64, top int64) ([]int, int64) {
	for _, w := range waits {
		top = max(top, w)
	}
	bucket := max(ceilMinute(top/12+1), 60_000)
	h := make([]int, top/bucket+1)
	for _, w := range waits {
		h[w/bucket]++
	}
	return h, bucket
}

// overrideName names the override of a proposal: its match's values and the
// section, in the characters a name may hold.
func overrideName(m Match, class event.Class) string {
	var b []byte
	for _, v := range []string{m.Provider, m.Model, m.Action, m.PromptTemplate, section(class)} {
		if v == "*" || v == "" {
			continue
		}
		if len(b) > 0 {
			b = append(b, '-')
		}
		for _, c := range []byte(v) {
			switch {
			case c >= 'A' && c <= 'Z':
				b = append(b, c+'a'-'A')
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
				b = append(b, c)
			default:
				b = append(b, '-')
			}
		}
	}
	return "advise-" + string(b)
}

func pct(v float64) string { return strconv.FormatFloat(v*100, 'f', 1, 64) + "%" }

func pcts(i Interval) string { return pct(i.Lo) + "-" + pct(i.Hi) }

func dollars(v float64) string { return "$" + strconv.FormatFloat(v, 'f', -1, 64) }

func dur(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
