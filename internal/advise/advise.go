// Package advise reads what the router decided over a range of the audit,
// and what reviewers then did, and proposes the policy changes the data
// supports: it is the code of `faultrouter policy advise` and of the
// console's Advise page.
//
// It measures, per failure class and provider/model (and per action and
// prompt template where the counts allow):
//
//   - for each retry number of a class, how often the next attempt
//     succeeded, its mean cost and the delay until it came;
//   - for each review owner and class, how often reviewers approved, by
//     band of output.confidence, and how long items waited;
//
// and proposes, each with its evidence (counts and a 95% interval):
//
//   - max_retries of a class lowered for a match, to n-1, when retry n
//     succeeds so rarely that even the interval's upper bound is under
//     Options.UselessBelow; raised by one when every retry succeeds at
//     least half the time (the lower bound), tasks still ran out of them,
//     and the shared retry budget leaves room;
//   - model_refusal.min_confidence lowered for a match to the lower edge of
//     the lowest confidence band, walking down from the current value,
//     whose refusals reviewers approve (the interval's lower bound at least
//     Options.ApproveAbove): the refusals they approve are not refusals;
//   - an owner's sla_ms raised to the 90th percentile of the waits (whole
//     minutes) when most items miss the SLA (the upper bound of the share
//     within it is under one half): an SLA nobody meets only pages people.
//
// No proposal comes from fewer than Options.MinCount observations. A change
// is proposed at the broadest match that shows it (a provider before its
// models) and not again at a narrower one; a provider or model seen with
// one model, action or template only is proposed at the narrower match, so
// that the candidate does not reach what the data never saw.
//
// What it does not propose: a higher min_confidence (refusals above it were
// never shown to anyone), a shorter SLA (answering early is no fault), a
// change for a class without max_retries or min_confidence. Waits are
// measured on the stream's own clocks: from the occurred_at of the attempt
// that opened the item to the reviewer's decision time (at). The delay of
// a retry is from the retried attempt's occurred_at to the next attempt's.
package advise

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Input is one input the router decided: a task event or a review
// decision, with the decision recorded in its audit record. Inputs of one
// task come in the order the router decided them.
type Input struct {
	Task string
	// Event is the task event; nil for a review decision.
	Event *event.TaskEvent
	// Review is the review decision; nil for a task event.
	Review *event.ReviewDecision
	// Decision is what the router recorded.
	Decision event.Decision
}

// Options configure Analyze.
type Options struct {
	// Policy is the policy the router ran with. Required.
	Policy *policy.Policy
	// MinCount is the fewest observations a proposal rests on: retries of
	// one retry number, reviewed items of the confidence bands, answered
	// items of an owner. Default 30.
	MinCount int
	// UselessBelow: a retry whose success rate's upper bound is under it
	// does not help. Default 0.15.
	UselessBelow float64
	// ApproveAbove: a confidence band whose approval rate's lower bound is
	// at least it holds no refusals. Default 0.7.
	ApproveAbove float64
}

func (o *Options) defaults() {
	if o.MinCount <= 0 {
		o.MinCount = 30
	}
	if o.UselessBelow <= 0 {
		o.UselessBelow = 0.15
	}
	if o.ApproveAbove <= 0 {
		o.ApproveAbove = 0.7
	}
}

// BandWidth is the width of a confidence band.
const BandWidth = 0.05

// Report is what a range shows and what it proposes.
type Report struct {
	// Inputs and Tasks analysed.
	Inputs int `json:"inputs"`
	Tasks  int `json:"tasks"`
	// Retries: per class, provider/model and retry number, the next
	// attempt's outcome.
	Retries []RetryRow `json:"retries"`
	// Approvals: per owner, class and confidence band, the reviewers'
	// decisions.
	Approvals []BandRow `json:"approvals"`
	// Waits: per owner and class, how long items waited for a reviewer.
	Waits []WaitRow `json:"waits"`
	// Proposals, each with its evidence; empty when the range shows no
	// pattern the counts support.
	Proposals []Proposal `json:"proposals"`
	// MinCount is the fewest observations a proposal rests on.
	MinCount int `json:"min_count"`
}

// RetryRow is retry N of Class for a match: how many retries had a next
// attempt in the range (Success.N), how many of those succeeded
// (Success.K), the next attempts' mean cost and mean delay.
type RetryRow struct {
	Class       event.Class `json:"class"`
	Match       Match       `json:"match"`
	N           int         `json:"retry"`
	Success     Rate        `json:"success"`
	MeanCostUSD float64     `json:"mean_cost_usd"`
	MeanDelayMs int64       `json:"mean_delay_ms"`
}

// BandRow is the reviewers' decisions of one owner's items of one class
// whose opening output.confidence lay in [From, To) (From = To = -1: the
// output had no confidence).
type BandRow struct {
	Owner    string      `json:"owner"`
	Class    event.Class `json:"class"`
	Match    Match       `json:"match"`
	From     float64     `json:"from"`
	To       float64     `json:"to"`
	Approved Rate        `json:"approved"`
}

// WaitRow is how long one owner's items of one class waited.
type WaitRow struct {
	Owner string      `json:"owner"`
	Class event.Class `json:"class"`
	SLAMs int64       `json:"sla_ms"`
	Waits
	// Unanswered items had no review decision in the range.
	Unanswered int `json:"unanswered"`
}

// Match selects events as a policy override does: "*" is any.
type Match struct {
	Provider       string `json:"provider"`
	Model          string `json:"model"`
	Action         string `json:"action"`
	PromptTemplate string `json:"prompt_template"`
}

// Any matches every event.
var Any = Match{"*", "*", "*", "*"}

func (m Match) String() string {
	s := ""
	for _, kv := range [][2]string{{"provider", m.Provider}, {"model", m.Model}, {"action", m.Action}, {"prompt_template", m.PromptTemplate}} {
		if kv[1] != "*" {
			if s != "" {
				s += " "
			}
			s += kv[0] + "=" + kv[1]
		}
	}
	if s == "" {
		return "any"
	}
	return s
}

// contains reports whether m selects every event n selects.
func (m Match) contains(n Match) bool {
	in := func(a, b string) bool { return a == "*" || a == b }
	return in(m.Provider, n.Provider) && in(m.Model, n.Model) && in(m.Action, n.Action) && in(m.PromptTemplate, n.PromptTemplate)
}

// holds reports whether every event n selects is selected by m, where m
// may be a policy file's match (a value may be a prefix ending in "*").
func (m Match) holds(n Match) bool {
	a, b := m.values(), n.values()
	for i := range a {
		x, y := a[i], b[i]
		switch {
		case x == "*":
		case strings.HasSuffix(x, "*"):
			if y == "*" || !strings.HasPrefix(strings.TrimSuffix(y, "*"), strings.TrimSuffix(x, "*")) {
				return false
			}
		case x != y:
			return false
		}
	}
	return true
}

// overlaps reports whether an event can be selected by both m and n, either
// of which may be a policy file's match.
func (m Match) overlaps(n Match) bool {
	a, b := m.values(), n.values()
	for i := range a {
		x, y := a[i], b[i]
		if x == "*" || y == "*" {
			continue
		}
		px, py := strings.HasSuffix(x, "*"), strings.HasSuffix(y, "*")
		x, y = strings.TrimSuffix(x, "*"), strings.TrimSuffix(y, "*")
		switch {
		case px && py:
			if !strings.HasPrefix(x, y) && !strings.HasPrefix(y, x) {
				return false
			}
		case px:
			if !strings.HasPrefix(y, x) {
				return false
			}
		case py:
			if !strings.HasPrefix(x, y) {
				return false
			}
		case x != y:
			return false
		}
	}
	return true
}

func (m Match) values() [4]string {
	return [4]string{m.Provider, m.Model, m.Action, m.PromptTemplate}
}

// policyMatch is the match of a policy's override ("" is "*").
func policyMatch(pm policy.Match) Match {
	any := func(v string) string {
		if v == "" {
			return "*"
		}
		return v
	}
	return Match{any(pm.Provider), any(pm.Model), any(pm.Action), any(pm.PromptTemplate)}
}

// levels are the matches an event is counted under, broadest first: its
// provider, its provider/model, and that with its action or its template.
// An event without a provider or model counts under none.
func levels(ev *event.TaskEvent) []Match {
	if ev == nil || ev.Provider == "" || ev.Model == "" {
		return nil
	}
	p := Match{ev.Provider, "*", "*", "*"}
	pm := Match{ev.Provider, ev.Model, "*", "*"}
	out := []Match{p, pm}
	if ev.Action != "" {
		out = append(out, Match{ev.Provider, ev.Model, ev.Action, "*"})
	}
	if ev.PromptTemplate != "" {
		out = append(out, Match{ev.Provider, ev.Model, "*", ev.PromptTemplate})
	}
	return out
}

// depth is how narrow a match is: the number of keys it names.
func (m Match) depth() int {
	n := 0
	for _, v := range []string{m.Provider, m.Model, m.Action, m.PromptTemplate} {
		if v != "*" {
			n++
		}
	}
	return n
}

// parent is the match one level broader: provider/model for a match with an
// action or template, the provider for a provider/model.
func (m Match) parent() Match {
	switch {
	case m.Action != "*" || m.PromptTemplate != "*":
		return Match{m.Provider, m.Model, "*", "*"}
	case m.Model != "*":
		return Match{m.Provider, "*", "*", "*"}
	}
	return Any
}

// retryKey and its tallies.
type retryKey struct {
	class event.Class
	match Match
	n     int
}

type retryTally struct {
	trials, successes int
	costMicros        int64
	delayMs           int64
}

type bandKey struct {
	owner string
	class event.Class
	match Match
	band  int // -1: no confidence
}

type waitKey struct {
	owner string
	class event.Class
}

// item is an open review item of a task.
type item struct {
	owner      string
	class      event.Class
	rule       string
	opened     time.Time
	confidence *float64
	ev         *event.TaskEvent
}

// tallies are the counts Analyze gathers before it proposes.
type tallies struct {
	retries map[retryKey]*retryTally
	// exhausted counts, per class and match, the tasks that stopped in a
	// class after using every retry it allows
	exhausted map[retryKey]int
	// children: per class and match, the narrower matches seen under it
	children map[retryKey]map[Match]bool
	bands    map[bandKey]*[2]int // approved, decided
	waits    map[waitKey][]int64
	open     map[waitKey]int
	// lowConf: per match, refusals for low confidence decided by a
	// reviewer, by band, as (approved, decided)
	lowConf map[Match]map[int]*[2]int
	// first is the first event counted under each match: the running
	// policy's settings for the match are those it decided that event with
	// (an override of the running policy may change them)
	first map[Match]*event.TaskEvent
}

// Analyze measures the inputs and proposes.
func Analyze(inputs []Input, o Options) *Report {
	o.defaults()
	t := tallies{retries: map[retryKey]*retryTally{}, exhausted: map[retryKey]int{}, children: map[retryKey]map[Match]bool{},
		bands: map[bandKey]*[2]int{}, waits: map[waitKey][]int64{}, open: map[waitKey]int{}, lowConf: map[Match]map[int]*[2]int{},
		first: map[Match]*event.TaskEvent{}}
	byTask := map[string][]int{}
	var order []string
	for i := range inputs {
		task := inputs[i].Task
		if _, ok := byTask[task]; !ok {
			order = append(order, task)
		}
		byTask[task] = append(byTask[task], i)
	}
	for _, task := range order {
		t.task(inputs, byTask[task], o.Policy)
	}
	r := &Report{Inputs: len(inputs), Tasks: len(order), MinCount: o.MinCount}
	r.rows(&t, o.Policy)
	r.Proposals = propose(&t, o)
	return r
}

// task tallies one task's inputs.
func (t *tallies) task(inputs []Input, idx []int, p *policy.Policy) {
	retries := map[event.Class]int{}
	var open *item
	for j, i := range idx {
		in := &inputs[i]
		d := &in.Decision
		if d.Route == event.RouteDrop || d.Route == "" {
			continue
		}
		if in.Review != nil {
			if open != nil {
				t.answer(open, in.Review)
				open = nil
			}
			continue
		}
		ev := in.Event
		if ev == nil {
			continue
		}
		switch {
		case d.Route == event.RouteRetry:
			retries[d.Class]++
			n := retries[d.Class]
			next := nextAttempt(inputs, idx[j+1:])
			if next == nil {
				break
			}
			for _, m := range levels(ev) {
				if t.first[m] == nil {
					t.first[m] = ev
				}
				k := retryKey{d.Class, m, n}
				x := t.retries[k]
				if x == nil {
					x = &retryTally{}
					t.retries[k] = x
				}
				x.trials++
				if next.Decision.Class == event.ClassSucceeded {
					x.successes++
				}
				x.costMicros += micros(next.Event.Usage.CostUSD)
				x.delayMs += max(0, next.Event.OccurredAt.Time.Sub(ev.OccurredAt.Time).Milliseconds())
				t.child(d.Class, m)
			}
		case d.Route != event.RouteComplete:
			if max, ok := maxRetries(p, d.Class, ev); ok && retries[d.Class] >= int(max) && retries[d.Class] > 0 {
				for _, m := range levels(ev) {
					t.exhausted[retryKey{d.Class, m, 0}]++
				}
			}
		}
		if d.Review != nil && (d.Route == event.RouteReview || d.Route == event.RouteQuarantine) && open == nil {
			open = &item{owner: d.Review.Owner, class: d.Class, rule: d.Rule, opened: ev.OccurredAt.Time, ev: ev}
			if ev.Output != nil {
				open.confidence = ev.Output.Confidence
			}
		}
	}
	if open != nil {
		t.open[waitKey{open.owner, open.class}]++
	}
}

// child records m under its parent, for the rule that a match seen with one
// narrower match only is proposed at the narrower one.
func (t *tallies) child(class event.Class, m Match) {
	if m.depth() < 2 {
		return
	}
	k := retryKey{class: class, match: m.parent()}
	if t.children[k] == nil {
		t.children[k] = map[Match]bool{}
	}
	t.children[k][m] = true
}

// answer tallies a reviewer's decision of an open item.
func (t *tallies) answer(it *item, rd *event.ReviewDecision) {
	wk := waitKey{it.owner, it.class}
	t.waits[wk] = append(t.waits[wk], max(0, rd.At.Time.Sub(it.opened).Milliseconds()))
	band := -1
	if it.confidence != nil {
		band = bandOf(*it.confidence)
	}
	for _, m := range append([]Match{Any}, levels(it.ev)...) {
		if m != Any && m.depth() == 1 {
			continue // approval bands per provider/model and narrower
		}
		bk := bandKey{it.owner, it.class, m, band}
		x := t.bands[bk]
		if x == nil {
			x = &[2]int{}
			t.bands[bk] = x
		}
		x[1]++
		if rd.Approve {
			x[0]++
		}
	}
	if it.class != event.ClassModelRefusal || it.rule != policy.RuleRefusalLowConfidence || it.confidence == nil {
		return
	}
	for _, m := range levels(it.ev) {
		if t.first[m] == nil {
			t.first[m] = it.ev
		}
		if t.lowConf[m] == nil {
			t.lowConf[m] = map[int]*[2]int{}
		}
		b := bandOf(*it.confidence)
		x := t.lowConf[m][b]
		if x == nil {
			x = &[2]int{}
			t.lowConf[m][b] = x
		}
		x[1]++
		if rd.Approve {
			x[0]++
		}
	}
}

// nextAttempt is the first task event of idx that the router did not drop.
func nextAttempt(inputs []Input, idx []int) *Input {
	for _, i := range idx {
		in := &inputs[i]
		if in.Event != nil && in.Decision.Route != event.RouteDrop && in.Decision.Route != "" {
			return in
		}
	}
	return nil
}

func micros(usd float64) int64 { return int64(usd*1e6 + 0.5) }

// rows lays the tallies out as the report's tables: retries and approvals
// per provider/model (the proposals carry their own match's rows), waits
// per owner and class.
func (r *Report) rows(t *tallies, p *policy.Policy) {
	for k, x := range t.retries {
		if k.match.depth() != 2 {
			continue
		}
		r.Retries = append(r.Retries, retryRow(k, x))
	}
	slices.SortFunc(r.Retries, func(a, b RetryRow) int {
		return cmp.Or(cmp.Compare(a.Class, b.Class), cmp.Compare(a.Match.String(), b.Match.String()), cmp.Compare(a.N, b.N))
	})
	for k, x := range t.bands {
		if k.match != Any {
			continue
		}
		r.Approvals = append(r.Approvals, bandRow(k, x))
	}
	slices.SortFunc(r.Approvals, func(a, b BandRow) int {
		return cmp.Or(cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.Class, b.Class), cmp.Compare(a.From, b.From))
	})
	keys := map[waitKey]bool{}
	for k := range t.waits {
		keys[k] = true
	}
	for k := range t.open {
		keys[k] = true
	}
	for k := range keys {
		sla := p.Owners[k.owner].SLAMs
		r.Waits = append(r.Waits, WaitRow{Owner: k.owner, Class: k.class, SLAMs: sla, Waits: summarise(t.waits[k], sla), Unanswered: t.open[k]})
	}
	slices.SortFunc(r.Waits, func(a, b WaitRow) int { return cmp.Or(cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.Class, b.Class)) })
}

func retryRow(k retryKey, x *retryTally) RetryRow {
	row := RetryRow{Class: k.class, Match: k.match, N: k.n, Success: rateOf(x.successes, x.trials)}
	if x.trials > 0 {
		row.MeanCostUSD = float64(x.costMicros/int64(x.trials)) / 1e6
		row.MeanDelayMs = x.delayMs / int64(x.trials)
	}
	return row
}

func bandRow(k bandKey, x *[2]int) BandRow {
	row := BandRow{Owner: k.owner, Class: k.class, Match: k.match, From: -1, To: -1, Approved: rateOf(x[0], x[1])}
	if k.band >= 0 {
		row.From, row.To = bandEdge(k.band), bandEdge(k.band+1)
	}
	return row
}

// bandOf is the confidence band of c: band b is [b x BandWidth, (b+1) x
// BandWidth).
func bandOf(c float64) int { return int(math.Floor(c/BandWidth + 1e-9)) }

// bandEdge is the lower edge of band b, to two decimals.
func bandEdge(b int) float64 { return float64(int(float64(b)*BandWidth*100+0.5)) / 100 }

// maxRetries is the running policy's max_retries of class for ev (nil: the
// base policy's), if the class has one.
func maxRetries(p *policy.Policy, class event.Class, ev *event.TaskEvent) (int32, bool) {
	if ev != nil {
		if o, ok := p.OverrideFor(ev); ok {
			switch {
			case class == event.ClassNetworkTimeout && o.NetworkTimeout != nil:
				return o.NetworkTimeout.MaxRetries, true
			case class == event.ClassAuthFailed && o.AuthFailed != nil:
				return o.AuthFailed.MaxRetries, true
			case class == event.ClassValidationFixable && o.ValidationFixable != nil:
				return o.ValidationFixable.MaxRetries, true
			}
		}
	}
	switch class {
	case event.ClassNetworkTimeout:
		return p.NetworkTimeout.MaxRetries, true
	case event.ClassAuthFailed:
		return p.AuthFailed.MaxRetries, true
	case event.ClassValidationFixable:
		return p.ValidationFixable.MaxRetries, true
	}
	return 0, false
}

// minConfidence is the running policy's model_refusal.min_confidence for
// ev (nil: the base policy's).
func minConfidence(p *policy.Policy, ev *event.TaskEvent) float64 {
	if ev != nil {
		if o, ok := p.OverrideFor(ev); ok && o.ModelRefusal != nil {
			return o.ModelRefusal.MinConfidence
		}
	}
	return p.ModelRefusal.MinConfidence
}

// section is the policy file's section of class.
func section(class event.Class) string {
	switch class {
	case event.ClassNetworkTimeout:
		return "network_timeout"
	case event.ClassAuthFailed:
		return "auth_failed"
	case event.ClassValidationFixable:
		return "validation_fixable"
	case event.ClassModelRefusal:
		return "model_refusal"
	}
	return ""
}
