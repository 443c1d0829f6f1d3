// Package ledger is faultrouter's cost ledger. It accounts every decided
// attempt's usage (cost, tokens, elapsed time) by class, route,
// provider/model, prompt template and review owner, split into failed and
// successful attempts, and sums the cost the router's stops prevented. It
// does no I/O: `faultrouter cost` and the console feed it the audit records
// of a time range, the checker its model's decisions.
//
// An attempt is counted once: every task event decided with another route
// than DROP (an exact redelivery is the same attempt again; the audit record
// of a review decision, which carries the task's last event, is none), except a
// repeat of an attempt already counted (policy.Repeat): a record forwarded
// to its task's partition (its copy there is the attempt), a re-drive, a
// redelivery after the task's TTL. The router names a repeat in the audit
// record's faultrouter.attempt.repeat header (RepeatOf also knows forwards
// and re-drives of builds before it). An attempt is successful when decided
// SUCCEEDED, failed otherwise: an error, a refusal, an output that breaks
// its schema, work reported for a task that had already ended
// (DUPLICATE_EXECUTION), an event that could not be routed. Money is summed
// in whole micro-dollars, so sums are exact and independent of order.
//
// Cost prevented is the sum of the claims the decisions carry
// (decision.prevented: policy.Claim, per task, so that a task's claims add
// up to what its baseline had left after its last attempt; a negative claim
// nets off attempts made after a stop), else, for audit records of builds
// before that field, the one policy.PreventedBy computes for a stop with
// the ledger's policy.
package ledger

import (
	"cmp"
	"math"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Ledger sums the usage of decided attempts. The zero value is not usable:
// build one with New.
type Ledger struct {
	p       *policy.Policy
	total   sums
	classes map[string]*sums
	routes  map[string]*sums
	models  map[string]*sums
	tmpls   map[string]*sums
	owners  map[string]*sums
	stops   map[string]*sums
}

// sums are the running sums of one row.
type sums struct {
	attempts, failed                int64
	cost, failedCost                int64 // micro-dollars
	tokens, elapsedMs               int64
	stops, preventedAttempts, saved int64 // saved: micro-dollars prevented
}

// New returns an empty ledger measuring cost prevented against p's baseline.
func New(p *policy.Policy) *Ledger {
	return &Ledger{p: p, classes: map[string]*sums{}, routes: map[string]*sums{}, models: map[string]*sums{},
		tmpls: map[string]*sums{}, owners: map[string]*sums{}, stops: map[string]*sums{}}
}

// Micros is a dollar amount in whole micro-dollars.
func Micros(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// None is the row key of a missing provider/model, template or owner.
const None = "(none)"

// ModelKey is the provider/model row key of an event.
func ModelKey(ev *event.TaskEvent) string {
	if ev.Provider == "" && ev.Model == "" {
		return None
	}
	return ev.Provider + "/" + ev.Model
}

func orNone(s string) string {
	if s == "" {
		return None
	}
	return s
}

// TaskEvent reports whether an audit record's event and decision are those
// of a task event the router decided: not a DROP (an exact redelivery), not
// a forward (its copy is decided on its task's partition), not a review
// decision, whose audit record carries the task's last event.
func TaskEvent(ev *event.TaskEvent, d *event.Decision) bool {
	switch {
	case ev == nil, d.Route == event.RouteDrop, d.Rule == policy.RulePartitionForward:
		return false
	case d.Rule == policy.RuleManualOverride, d.Rule == policy.RuleManualRejected, d.Rule == policy.RuleNoOpenItem:
		return false
	}
	return true
}

// Counts reports whether a decision of a task event is an attempt the
// ledger accounts: every route but DROP, unless it repeats an attempt
// already counted (repeat, from RepeatOf; a forward is one whatever repeat
// says).
func Counts(ev *event.TaskEvent, d *event.Decision, repeat policy.Repeat) bool {
	return TaskEvent(ev, d) && repeat == ""
}

// RepeatOf says whether the audit record of decision d, with headers,
// repeats an attempt already counted: the faultrouter.attempt.repeat header
// the router writes, else (records of builds before it) a forward's rule
// or a re-drive's faultrouter.redrive.* headers.
func RepeatOf(d *event.Decision, headers []kgo.RecordHeader) policy.Repeat {
	for _, h := range headers {
		if h.Key == codec.HeaderRepeat {
			return policy.Repeat(h.Value)
		}
	}
	switch {
	case d.Rule == policy.RulePartitionForward:
		return policy.RepeatForwarded
	case codec.ParseHeaders(headers).Redrive != nil:
		return policy.RepeatRedrive
	}
	return ""
}

// Add accounts one decided task event: its usage unless it repeats an
// attempt already counted (repeat, from RepeatOf), and the cost prevented
// it claims. A DROP (exact redelivery) or a decision without an event is
// ignored.
func (l *Ledger) Add(ev *event.TaskEvent, d *event.Decision, repeat policy.Repeat) {
	if !TaskEvent(ev, d) {
		return
	}
	var one sums
	if Counts(ev, d, repeat) {
		one.attempts, one.cost, one.tokens, one.elapsedMs = 1, Micros(ev.Usage.CostUSD), ev.Usage.Tokens, ev.Usage.ElapsedMs
		if d.Class != event.ClassSucceeded {
			one.failed, one.failedCost = 1, one.cost
		}
	}
	stop := ""
	if pr := d.Prevented; pr != nil {
		stop = pr.Stop
		one.preventedAttempts, one.saved = int64(pr.Attempts), Micros(pr.USD)
		if _, ok := policy.StopOf(d); ok {
			one.stops = 1
		}
	} else if pr, ok := l.p.PreventedBy(d); ok {
		stop = string(pr.Stop)
		one.stops, one.preventedAttempts, one.saved = 1, int64(pr.Attempts), Micros(pr.USD)
	}
	owner := None
	if d.Review != nil {
		owner = orNone(d.Review.Owner)
	}
	l.total.add(&one)
	row(l.classes, string(d.Class)).add(&one)
	row(l.routes, string(d.Route)).add(&one)
	row(l.models, ModelKey(ev)).add(&one)
	row(l.tmpls, orNone(ev.PromptTemplate)).add(&one)
	row(l.owners, owner).add(&one)
	if stop != "" && (one.stops > 0 || one.saved != 0 || one.preventedAttempts != 0) {
		row(l.stops, stop).add(&one)
	}
}

func row(m map[string]*sums, k string) *sums {
	s := m[k]
	if s == nil {
		s = &sums{}
		m[k] = s
	}
	return s
}

func (s *sums) add(o *sums) {
	s.attempts += o.attempts
	s.failed += o.failed
	s.cost += o.cost
	s.failedCost += o.failedCost
	s.tokens += o.tokens
	s.elapsedMs += o.elapsedMs
	s.stops += o.stops
	s.preventedAttempts += o.preventedAttempts
	s.saved += o.saved
}

// Row is one line of a report: the attempts of one key and their usage.
type Row struct {
	Key string `json:"key"`
	// Attempts decided, Failed of them not SUCCEEDED.
	Attempts int64 `json:"attempts"`
	Failed   int64 `json:"failed_attempts"`
	// CostUSD is the sum of usage.cost_usd; FailedUSD that of the failed
	// attempts, SucceededUSD the rest.
	CostUSD      float64 `json:"cost_usd"`
	FailedUSD    float64 `json:"failed_usd"`
	SucceededUSD float64 `json:"succeeded_usd"`
	Tokens       int64   `json:"tokens"`
	ElapsedMs    int64   `json:"elapsed_ms"`
	// Stops are the decisions that stopped a task (policy.StopOf);
	// PreventedAttempts the baseline attempts the row's decisions claim as
	// avoided (net of the attempts made after a stop), PreventedUSD those
	// attempts at each task's mean attempt cost.
	Stops             int64   `json:"stops"`
	PreventedAttempts int64   `json:"prevented_attempts"`
	PreventedUSD      float64 `json:"prevented_usd"`
}

func (s *sums) row(key string) Row {
	return Row{Key: key, Attempts: s.attempts, Failed: s.failed, CostUSD: usd(s.cost), FailedUSD: usd(s.failedCost),
		SucceededUSD: usd(s.cost - s.failedCost), Tokens: s.tokens, ElapsedMs: s.elapsedMs,
		Stops: s.stops, PreventedAttempts: s.preventedAttempts, PreventedUSD: usd(s.saved)}
}

func usd(micros int64) float64 { return float64(micros) / 1e6 }

// Report is the ledger's sums. The totals are of every attempt; each list
// splits the same attempts by one key, most expensive first.
type Report struct {
	// Attempts, TotalUSD (the sum of usage.cost_usd), FailedUSD,
	// SucceededUSD, Tokens and ElapsedMs are of every attempt.
	Attempts     int64   `json:"attempts"`
	TotalUSD     float64 `json:"total_usd"`
	FailedUSD    float64 `json:"failed_usd"`
	SucceededUSD float64 `json:"succeeded_usd"`
	Tokens       int64   `json:"tokens"`
	ElapsedMs    int64   `json:"elapsed_ms"`
	// PreventedUSD is the cost prevented, against a baseline that retries
	// every failure BaselineRetries times.
	PreventedUSD    float64 `json:"prevented_usd"`
	BaselineRetries int32   `json:"baseline_retries"`
	Classes         []Row   `json:"classes"`
	Routes          []Row   `json:"routes"`
	Models          []Row   `json:"models"`
	Templates       []Row   `json:"templates"`
	Owners          []Row   `json:"owners"`
	// Prevented splits the cost prevented by stop (refusal, dead_letter,
	// budget, unknown_write).
	Prevented []Row `json:"prevented"`
}

// Report returns the sums so far.
func (l *Ledger) Report() Report {
	t := l.total.row("")
	return Report{
		Attempts: t.Attempts, TotalUSD: t.CostUSD, FailedUSD: t.FailedUSD, SucceededUSD: t.SucceededUSD,
		Tokens: t.Tokens, ElapsedMs: t.ElapsedMs, PreventedUSD: t.PreventedUSD,
		BaselineRetries: l.p.CostPrevented.BaselineRetries,
		Classes:         rows(l.classes), Routes: rows(l.routes), Models: rows(l.models),
		Templates: rows(l.tmpls), Owners: rows(l.owners), Prevented: rows(l.stops),
	}
}

// rows lists m most expensive first, then by key.
func rows(m map[string]*sums) []Row {
	out := make([]Row, 0, len(m))
	for k, s := range m {
		out = append(out, s.row(k))
	}
	slices.SortFunc(out, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.CostUSD, a.CostUSD), cmp.Compare(b.PreventedUSD, a.PreventedUSD), cmp.Compare(a.Key, b.Key))
	})
	return out
}
