// Package whatif compares two replays of the same committed inputs, one
// through a baseline policy and one through a candidate (checker.Replay;
// run.go reads the inputs of a time range and runs both),
// and reports what the candidate would have changed: the decisions that
// differ, a transition matrix per class, retries added and removed, routes,
// review load per owner, the cost impact, and example tasks. It first checks
// the baseline replay against the decisions the router recorded: a
// disagreement means the what-if cannot be trusted for that task, and says
// why.
//
// The counterfactual has limits, stated in every report with how many
// decisions of the range each could touch (Limits, Limit): the
// inputs are what the workers reported under the policy that ran. After a
// changed decision nobody knows what a worker would have done: a retry the
// candidate adds is replayed against the attempts that really followed (if
// any), and attempts the candidate would have stopped are still in the log.
// So the cost of attempts the candidate stops is observed (they happened),
// the cost of attempts it adds is estimated (from the observed mean attempt
// cost of that class and provider/model). Breakers never change a decision
// (they hold or release retries at publication); their openings per key are
// estimated by feeding each policy's decisions to one breaker set.
package whatif

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Options configure Compare.
type Options struct {
	// Baseline and Candidate are the two policies. Required.
	Baseline, Candidate *policy.Policy
	// Since and Until are the range the inputs were read from (review load
	// per day).
	Since, Until time.Time
	// Examples is how many example tasks each changed cell and the
	// disagreements keep. Default 3.
	Examples int
}

// The counterfactual's approximations, printed with every report, each
// with how many decisions of the range it could touch (Limit).
const (
	LimitWorkers  = "inputs are what workers reported under the policy that ran: after a changed decision, what a worker would have done is unknown"
	LimitAdded    = "a retry the candidate adds is replayed against the attempts that really followed, if any; its cost is estimated from the observed mean attempt cost of its class and provider/model"
	LimitDropped  = "attempts after a retry the candidate drops are still in the log and replayed (as work for an ended task); their cost is observed"
	LimitBreakers = "breakers never change a decision (they hold or release retries when due); their openings are estimated by feeding each policy's decisions, in time order, to one breaker set"
	LimitHeld     = "a task's state expires 2 x SLA after its last decision or its retry's publication: a retry the router published is taken at its recorded time (a breaker's hold included), one only the candidate makes at its due time, as if no breaker held it; a hold moves the expiry, hence the decisions after it"
	LimitTTL      = "a decision on a state that expired (its TTL) in one replay depends on the times above; had the candidate kept or forgotten the state at another time, the decisions after it would differ"
	LimitRange    = "a task whose life starts before the range is replayed from an empty state: it disagrees with the audit, and is counted in disagreements"
	LimitReview   = "a review item the candidate opens and the baseline did not was never shown to anyone: it is answered only by a review decision that really followed"
)

// Limits are the counterfactual's approximations, in the order reports
// print them.
var Limits = []string{LimitWorkers, LimitAdded, LimitDropped, LimitBreakers, LimitHeld, LimitTTL, LimitRange, LimitReview}

// Limit is one approximation of a report and how many of its decisions it
// could touch.
type Limit struct {
	Text      string `json:"limit"`
	Decisions int    `json:"decisions"`
}

// Report is what the candidate would have changed.
type Report struct {
	Since, Until string `json:"-"`
	// Tasks and Decisions replayed (task events and review decisions).
	Tasks     int `json:"tasks"`
	Decisions int `json:"decisions"`
	// Disagreements counts the baseline replay's decisions that differ from
	// the router's recorded ones; DisagreementTasks the tasks they touch.
	// Non-zero: the what-if cannot be trusted for those tasks (Why).
	Disagreements     int            `json:"disagreements"`
	DisagreementTasks int            `json:"disagreement_tasks"`
	Why               map[string]int `json:"disagreements_why"`
	DisagreementList  []Disagreement `json:"disagreement_examples"`
	// Changed counts the decisions the candidate makes differently (class,
	// route, rule or retry delay); ChangedTasks the tasks they touch.
	Changed      int `json:"changed"`
	ChangedTasks int `json:"changed_tasks"`
	// Matrix holds, per baseline class, every baseline -> candidate
	// transition with its count; changed cells carry example tasks.
	Matrix  []Cell      `json:"matrix"`
	Routes  []RouteRow  `json:"routes"`
	Retries Retries     `json:"retries"`
	Review  []OwnerLoad `json:"review_load"`
	// Breakers are the breaker openings per key under each policy
	// (estimated: see BreakerRow).
	Breakers []BreakerRow `json:"breaker_openings"`
	Cost     Cost         `json:"cost"`
	// Changes are the changed decisions (the CSV).
	Changes []Change `json:"changes"`
	// Timelines holds, for each example task of a changed cell, every
	// decision of the task in the range under both policies, in order.
	Timelines map[string][]Step `json:"timelines,omitempty"`
	// Limits are the approximations (Limits), each with how many decisions
	// of the range it could touch.
	Limits []Limit `json:"limits"`
}

// Step is one decision of an example task's timeline: the baseline's and
// the candidate's, and whether they differ.
type Step struct {
	Change
	Changed bool `json:"changed"`
}

// Disagreement is one baseline decision that differs from the recorded one.
type Disagreement struct {
	Task   string `json:"task"`
	Input  string `json:"input"`
	Detail string `json:"detail"`
	Why    string `json:"why"`
}

// Reasons a baseline replay disagrees with the audit.
const (
	WhyRangeStart = "range_starts_inside_task"
	WhyPolicy     = "baseline_differs_from_running_policy"
	WhyNoAudit    = "no_audit_record"
	// WhyExpiry: the router decided on a fresh state (the task's state had
	// expired) and the replay on the state it carried, or the other way
	// round: a retry's publication time or the logs read do not say when
	// the router forgot the task.
	WhyExpiry = "task_state_expiry"
)

// Cell is one transition of the matrix.
type Cell struct {
	Class    event.Class `json:"class"`
	From     event.Route `json:"from"`
	ToClass  event.Class `json:"to_class"`
	To       event.Route `json:"to"`
	Count    int         `json:"count"`
	Changed  bool        `json:"changed"`
	Examples []string    `json:"examples,omitempty"`
}

// RouteRow counts the decisions of one route under each policy.
type RouteRow struct {
	Route     event.Route `json:"route"`
	Baseline  int         `json:"baseline"`
	Candidate int         `json:"candidate"`
}

// Retries are the RETRY decisions of each policy; Added and Removed sum,
// per task, the retries the candidate makes more or fewer.
type Retries struct {
	Baseline  int `json:"baseline"`
	Candidate int `json:"candidate"`
	Added     int `json:"added"`
	Removed   int `json:"removed"`
}

// OwnerLoad is one review owner's items (REVIEW and QUARANTINE decisions)
// under each policy, in all and per day of the range (a range shorter than a
// day counts as one day), and how many of them a person answered within the
// owner's SLA (each policy's own): an item is answered by the next review
// decision of its task in the range, at the time that decision was really
// made. Items nobody answered in the range count in Unanswered. A candidate
// item that the baseline did not open was never shown to anyone: it stays
// unanswered unless a review decision of the task follows.
type OwnerLoad struct {
	Owner               string  `json:"owner"`
	SLAMs               int64   `json:"sla_ms"`
	Baseline            int     `json:"baseline"`
	Candidate           int     `json:"candidate"`
	BaselinePerDay      float64 `json:"baseline_per_day"`
	CandidatePerDay     float64 `json:"candidate_per_day"`
	BaselineWithinSLA   int     `json:"baseline_within_sla"`
	CandidateWithinSLA  int     `json:"candidate_within_sla"`
	BaselineUnanswered  int     `json:"baseline_unanswered"`
	CandidateUnanswered int     `json:"candidate_unanswered"`
}

// Cost is the candidate's cost impact. Observed amounts are sums of reported
// usage; estimated ones are means times counts.
type Cost struct {
	// RemovedAttempts happened after a retry the candidate drops;
	// RemovedUSD is their reported cost (observed).
	RemovedAttempts int     `json:"removed_attempts"`
	RemovedUSD      float64 `json:"removed_usd_observed"`
	// AddedAttempts are the retries the candidate adds; AddedUSD their
	// estimated cost (estimated).
	AddedAttempts int     `json:"added_attempts"`
	AddedUSD      float64 `json:"added_usd_estimated"`
	// NetUSD is AddedUSD - RemovedUSD: positive, the candidate spends more.
	NetUSD float64 `json:"net_usd"`
	// ObservedUSD is the reported cost of every attempt replayed.
	ObservedUSD float64 `json:"observed_usd"`
}

// Change is one decision the candidate changes.
type Change struct {
	Task           string      `json:"task"`
	Input          string      `json:"input"`
	DecidedAt      time.Time   `json:"decided_at"`
	BaselineClass  event.Class `json:"baseline_class"`
	BaselineRoute  event.Route `json:"baseline_route"`
	BaselineRule   string      `json:"baseline_rule"`
	CandidateClass event.Class `json:"candidate_class"`
	CandidateRoute event.Route `json:"candidate_route"`
	CandidateRule  string      `json:"candidate_rule"`
}

// Differs reports whether two decisions of one input differ for a what-if:
// class, route, rule, retry delay, or the review item's owner or priority.
// The reason's text (which names the policy's numbers) does not count.
func Differs(a, b *event.Decision) bool {
	if a.Class != b.Class || a.Route != b.Route || a.Rule != b.Rule {
		return true
	}
	if (a.Retry == nil) != (b.Retry == nil) || a.Retry != nil && a.Retry.DelayMs != b.Retry.DelayMs {
		return true
	}
	if (a.Review == nil) != (b.Review == nil) {
		return true
	}
	return a.Review != nil && (a.Review.Owner != b.Review.Owner || a.Review.Priority != b.Review.Priority)
}

// Compare compares the baseline and candidate replays of the same inputs.
func Compare(base, cand []checker.Decided, o Options) (*Report, error) {
	if o.Baseline == nil || o.Candidate == nil {
		return nil, fmt.Errorf("whatif: Options: Baseline and Candidate are required")
	}
	if len(base) != len(cand) {
		return nil, fmt.Errorf("whatif: the replays differ in length (%d and %d): not the same inputs", len(base), len(cand))
	}
	if o.Examples <= 0 {
		o.Examples = 3
	}
	r := &Report{Decisions: len(base), Why: map[string]int{}}
	lim := newLimits()
	if !o.Since.IsZero() {
		r.Since = o.Since.UTC().Format(time.RFC3339)
	}
	if !o.Until.IsZero() {
		r.Until = o.Until.UTC().Format(time.RFC3339)
	}
	means := meanCosts(base)
	cells := map[[4]string]*Cell{}
	routes := map[event.Route]*RouteRow{}
	owners := map[string]*OwnerLoad{}
	disagreeing, changedTasks := map[string]bool{}, map[string]bool{}
	retries := map[string]int{} // candidate - baseline, per task
	slaB, slaC := reviewClock{}, reviewClock{}
	var tasks []string
	seen := map[string]bool{}
	var observed int64
	for i := range base {
		b, c := &base[i], &cand[i]
		if b.Input != c.Input {
			return nil, fmt.Errorf("whatif: replay %d is input %s in one and %s in the other: not the same inputs", i, b.Input, c.Input)
		}
		if !seen[b.Task] {
			seen[b.Task] = true
			tasks = append(tasks, b.Task)
		}
		if b.Diff != "" {
			r.Disagreements++
			why := whyDisagree(base, i, o.Baseline)
			r.Why[why]++
			if !disagreeing[b.Task] {
				disagreeing[b.Task] = true
				if len(r.DisagreementList) < 20 {
					r.DisagreementList = append(r.DisagreementList, Disagreement{Task: b.Task, Input: b.Input, Detail: b.Diff, Why: why})
				}
			}
		}
		if b.Event != nil && ledger.Counts(b.Event, &b.Model, b.Repeat) {
			observed += ledger.Micros(b.Event.Usage.CostUSD)
		}
		bd, cd := &b.Model, &c.Model
		k := [4]string{string(bd.Class), string(bd.Route), string(cd.Class), string(cd.Route)}
		cell := cells[k]
		if cell == nil {
			cell = &Cell{Class: bd.Class, From: bd.Route, ToClass: cd.Class, To: cd.Route}
			cells[k] = cell
		}
		cell.Count++
		row(routes, bd.Route).Baseline++
		row(routes, cd.Route).Candidate++
		if bd.Route == event.RouteRetry {
			r.Retries.Baseline++
			retries[b.Task]--
		}
		if cd.Route == event.RouteRetry {
			r.Retries.Candidate++
			retries[b.Task]++
		}
		if bd.Review != nil && bd.Route != event.RouteDrop {
			load(owners, bd.Review.Owner, o.Candidate).Baseline++
		}
		if cd.Review != nil && cd.Route != event.RouteDrop {
			load(owners, cd.Review.Owner, o.Candidate).Candidate++
		}
		slaB.step(b, bd, owners, o.Baseline, false)
		slaC.step(c, cd, owners, o.Candidate, true)
		lim.step(b, c)
		if !Differs(bd, cd) {
			continue
		}
		r.Changed++
		cell.Changed = true
		changedTasks[b.Task] = true
		if !slices.Contains(cell.Examples, b.Task) && len(cell.Examples) < o.Examples {
			cell.Examples = append(cell.Examples, b.Task)
		}
		r.Changes = append(r.Changes, Change{Task: b.Task, Input: b.Input, DecidedAt: b.At,
			BaselineClass: bd.Class, BaselineRoute: bd.Route, BaselineRule: bd.Rule,
			CandidateClass: cd.Class, CandidateRoute: cd.Route, CandidateRule: cd.Rule})
		// a retry the candidate adds: one more attempt, at the mean cost
		if cd.Route == event.RouteRetry && bd.Route != event.RouteRetry {
			r.Cost.AddedAttempts++
			if b.Event != nil {
				r.Cost.AddedUSD += means.of(bd.Class, ledger.ModelKey(b.Event))
			}
		}
	}
	// the example tasks' timelines: each of their decisions, changed or not
	examples := map[string]bool{}
	for _, cell := range cells {
		for _, t := range cell.Examples {
			examples[t] = true
		}
	}
	for i := range base {
		b, c := &base[i], &cand[i]
		if !examples[b.Task] {
			continue
		}
		if r.Timelines == nil {
			r.Timelines = map[string][]Step{}
		}
		bd, cd := &b.Model, &c.Model
		r.Timelines[b.Task] = append(r.Timelines[b.Task], Step{Changed: Differs(bd, cd), Change: Change{Task: b.Task, Input: b.Input, DecidedAt: b.At,
			BaselineClass: bd.Class, BaselineRoute: bd.Route, BaselineRule: bd.Rule,
			CandidateClass: cd.Class, CandidateRoute: cd.Route, CandidateRule: cd.Rule}})
	}
	r.Tasks = len(tasks)
	r.DisagreementTasks = len(disagreeing)
	r.ChangedTasks = len(changedTasks)
	for _, n := range retries {
		if n > 0 {
			r.Retries.Added += n
		} else {
			r.Retries.Removed -= n
		}
	}
	removedAttempts, removed := removedCost(base, cand)
	r.Cost.RemovedAttempts, r.Cost.RemovedUSD = removedAttempts, float64(removed)/1e6
	r.Limits = lim.finish(r)
	r.Cost.AddedUSD = float64(ledger.Micros(r.Cost.AddedUSD)) / 1e6
	r.Cost.NetUSD = float64(ledger.Micros(r.Cost.AddedUSD)-removed) / 1e6
	r.Cost.ObservedUSD = float64(observed) / 1e6

	for _, c := range cells {
		r.Matrix = append(r.Matrix, *c)
	}
	slices.SortFunc(r.Matrix, func(a, b Cell) int {
		return cmp.Or(cmp.Compare(a.Class, b.Class), cmp.Compare(a.From, b.From), cmp.Compare(a.ToClass, b.ToClass), cmp.Compare(a.To, b.To))
	})
	for _, x := range routes {
		r.Routes = append(r.Routes, *x)
	}
	slices.SortFunc(r.Routes, func(a, b RouteRow) int { return cmp.Compare(a.Route, b.Route) })
	days := 1.0 // a range shorter than a day counts as one
	if !o.Since.IsZero() && o.Until.After(o.Since) {
		days = max(1, o.Until.Sub(o.Since).Hours()/24)
	}
	slaB.finish(owners, o.Candidate, false)
	slaC.finish(owners, o.Candidate, true)
	for _, x := range owners {
		x.BaselinePerDay, x.CandidatePerDay = float64(x.Baseline)/days, float64(x.Candidate)/days
		r.Review = append(r.Review, *x)
	}
	slices.SortFunc(r.Review, func(a, b OwnerLoad) int { return cmp.Compare(a.Owner, b.Owner) })
	r.Breakers = breakerRows(base, cand, o)
	return r, nil
}

func row(m map[event.Route]*RouteRow, rt event.Route) *RouteRow {
	x := m[rt]
	if x == nil {
		x = &RouteRow{Route: rt}
		m[rt] = x
	}
	return x
}

func load(m map[string]*OwnerLoad, owner string, p *policy.Policy) *OwnerLoad {
	x := m[owner]
	if x == nil {
		x = &OwnerLoad{Owner: owner, SLAMs: p.Owners[owner].SLAMs}
		m[owner] = x
	}
	return x
}

// whyDisagree says why the baseline's decision of base[i] differs from the
// recorded one: no audit record; the task's first decision in the range
// counts fewer attempts than the router had (the range starts inside the
// task's life); the router decided on a fresh state where the replay kept
// the task's (the recorded decision counts fewer attempts than the
// replay's and is p's on a fresh state), or the replay
// forgot a state the router kept (its decision counts fewer attempts than
// the recorded one): the task's state expiry; otherwise the baseline is not
// the policy that ran.
func whyDisagree(base []checker.Decided, i int, p *policy.Policy) string {
	d := &base[i]
	if !d.Audited || d.Model.Route == "" {
		return WhyNoAudit
	}
	first := i
	for first > 0 && base[first-1].Task == d.Task {
		first--
	}
	f := &base[first]
	if f.Audited && (f.Recorded.Totals.Attempts > f.Model.Totals.Attempts || f.Review != nil) {
		return WhyRangeStart
	}
	if d.Fresh && d.Recorded.Totals.Attempts > d.Model.Totals.Attempts {
		return WhyExpiry
	}
	if d.Event != nil && !d.Fresh && d.Recorded.Totals.Attempts < d.Model.Totals.Attempts {
		var st task.State
		fresh := p.Decide(d.Event, &st, d.At)
		if !Differs(&fresh, &d.Recorded) && fresh.Totals.Attempts == d.Recorded.Totals.Attempts {
			return WhyExpiry
		}
	}
	return WhyPolicy
}

// limits counts, for each approximation (Limits), the decisions of the
// range it could touch: after a task's first changed decision, every later
// one (the worker's behaviour); the retries the candidate adds; the
// attempts after a retry it drops; the decisions that feed breakers; the
// decisions after an estimated retry publication in the candidate replay;
// the decisions on a state that expired in either replay; the decisions of
// tasks whose life starts before the range; the review items the candidate
// alone opens.
type limits struct {
	n       map[string]int
	changed map[string]bool // tasks with a changed decision so far
	held    map[string]bool // tasks after an estimated retry publication
}

func newLimits() *limits {
	return &limits{n: map[string]int{}, changed: map[string]bool{}, held: map[string]bool{}}
}

func (l *limits) step(b, c *checker.Decided) {
	bd, cd := &b.Model, &c.Model
	if l.changed[b.Task] {
		l.n[LimitWorkers]++
	}
	if Differs(bd, cd) {
		l.changed[b.Task] = true
	}
	if cd.Route == event.RouteRetry && bd.Route != event.RouteRetry {
		l.n[LimitAdded]++
	}
	if b.Event != nil && bd.Route != "" && bd.Route != event.RouteDrop || c.Event != nil && cd.Route != "" && cd.Route != event.RouteDrop {
		l.n[LimitBreakers]++
	}
	if c.Estimated || b.Estimated {
		l.held[b.Task] = true
	}
	if l.held[b.Task] {
		l.n[LimitHeld]++
	}
	if b.Fresh || c.Fresh {
		l.n[LimitTTL]++
	}
	if cd.Review != nil && cd.Route != event.RouteDrop && (bd.Review == nil || bd.Route == event.RouteDrop) {
		l.n[LimitReview]++
	}
}

// finish returns the limits with their counts; r holds the rest.
func (l *limits) finish(r *Report) []Limit {
	l.n[LimitDropped] = r.Cost.RemovedAttempts
	l.n[LimitRange] = r.Why[WhyRangeStart]
	out := make([]Limit, 0, len(Limits))
	for _, t := range Limits {
		out = append(out, Limit{Text: t, Decisions: l.n[t]})
	}
	return out
}

// means are observed mean attempt costs (micro-dollars per attempt) by class
// and provider/model, by class, and over all attempts.
type means struct {
	byKey   map[[2]string][2]int64
	byClass map[event.Class][2]int64
	all     [2]int64
}

func meanCosts(base []checker.Decided) *means {
	m := &means{byKey: map[[2]string][2]int64{}, byClass: map[event.Class][2]int64{}}
	add := func(s [2]int64, c int64) [2]int64 { return [2]int64{s[0] + c, s[1] + 1} }
	for i := range base {
		d := &base[i]
		if d.Event == nil || !ledger.Counts(d.Event, &d.Model, d.Repeat) {
			continue
		}
		c := ledger.Micros(d.Event.Usage.CostUSD)
		k := [2]string{string(d.Model.Class), ledger.ModelKey(d.Event)}
		m.byKey[k] = add(m.byKey[k], c)
		m.byClass[d.Model.Class] = add(m.byClass[d.Model.Class], c)
		m.all = add(m.all, c)
	}
	return m
}

// of is the mean attempt cost in dollars of class and provider/model, else
// of class, else of every attempt.
func (m *means) of(class event.Class, model string) float64 {
	for _, s := range [][2]int64{m.byKey[[2]string{string(class), model}], m.byClass[class], m.all} {
		if s[1] > 0 {
			return float64(s[0]) / float64(s[1]) / 1e6
		}
	}
	return 0
}

// removedCost sums the attempts that happened after a retry the candidate
// drops: in each task, after the first input the baseline retried and the
// candidate did not, every later task event the baseline counted as an
// attempt. Observed: their reported cost, in micro-dollars.
func removedCost(base, cand []checker.Decided) (int, int64) {
	n, sum := 0, int64(0)
	stoppedTask := ""
	for i := range base {
		b, c := &base[i], &cand[i]
		if b.Task != stoppedTask {
			stoppedTask = ""
		}
		if stoppedTask != "" {
			if b.Event != nil && ledger.Counts(b.Event, &b.Model, b.Repeat) {
				n++
				sum += ledger.Micros(b.Event.Usage.CostUSD)
			}
			continue
		}
		if b.Model.Route == event.RouteRetry && c.Model.Route != event.RouteRetry {
			stoppedTask = b.Task
		}
	}
	return n, sum
}

// reviewClock follows one policy's open review items, per task, to count
// the ones answered within their owner's SLA.
type reviewClock map[string]openItem

type openItem struct {
	owner string
	at    time.Time
}

// step follows one replayed input under one policy (its decision m): a
// review decision that the policy did not drop answers the task's open item;
// a REVIEW or QUARANTINE decision opens one.
func (rc reviewClock) step(d *checker.Decided, m *event.Decision, owners map[string]*OwnerLoad, p *policy.Policy, candidate bool) {
	if m.Route == "" || m.Route == event.RouteDrop {
		return
	}
	if it, ok := rc[d.Task]; ok && d.Review != nil {
		delete(rc, d.Task)
		x := load(owners, it.owner, p)
		if d.At.Sub(it.at) <= time.Duration(p.Owners[it.owner].SLAMs)*time.Millisecond {
			if candidate {
				x.CandidateWithinSLA++
			} else {
				x.BaselineWithinSLA++
			}
		}
	}
	if m.Review != nil && (m.Route == event.RouteReview || m.Route == event.RouteQuarantine) {
		if _, ok := rc[d.Task]; !ok {
			rc[d.Task] = openItem{owner: m.Review.Owner, at: d.At}
		}
	}
}

// finish counts the items still open at the end of the range.
func (rc reviewClock) finish(owners map[string]*OwnerLoad, p *policy.Policy, candidate bool) {
	for _, it := range rc {
		x := load(owners, it.owner, p)
		if candidate {
			x.CandidateUnanswered++
		} else {
			x.BaselineUnanswered++
		}
	}
}
