package console

// model.go is what the view holds and how each committed record changes it.
// Records of different topics arrive in no fixed order (a rebuild reads the
// audit topic as fast as the review topic), so every rule compares record
// times instead of trusting arrival order: an item is open while its latest
// review record is newer than the audit record that closed it.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// reviewItem is one task's human-review item, built from the review,
// decisions and audit topics.
type reviewItem struct {
	TaskID   string          `json:"task_id"`
	Class    string          `json:"class"`
	Route    string          `json:"route"`
	Rule     string          `json:"rule"`
	Reason   string          `json:"reason"`
	Owner    string          `json:"owner"`
	Priority string          `json:"priority"`
	SLAMs    int64           `json:"sla_ms"`
	Provider string          `json:"provider,omitempty"`
	Model    string          `json:"model,omitempty"`
	Template string          `json:"prompt_template,omitempty"`
	Action   string          `json:"action,omitempty"`
	Attempt  int32           `json:"attempt"`
	CostUSD  float64         `json:"cost_usd"`
	InputRef *event.InputRef `json:"input_ref,omitempty"`
	// OpenedAt is the time of the latest review record of the task.
	OpenedAt time.Time `json:"opened_at"`
	// Decision is the first decision written after OpenedAt; Later counts
	// the decisions written after it (refused by the console, or dropped by
	// the router as review.no_open_item).
	Decision *decisionRef `json:"decision,omitempty"`
	Later    int          `json:"later,omitempty"`
	// ClosedAt is the time of the audit record that closed the item.
	ClosedAt time.Time `json:"closed_at"`
	Closed   *closure  `json:"closed,omitempty"`
}

// decisionRef is a decision record on the decisions topic.
type decisionRef struct {
	Approve  bool      `json:"approve"`
	Reviewer string    `json:"reviewer"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
}

// closure is what the router's audit record says about the closed item.
type closure struct {
	Route       string `json:"route"`
	Rule        string `json:"rule"`
	Reason      string `json:"reason"`
	UserMessage string `json:"user_message,omitempty"`
}

// open reports whether the item waits for a person.
func (it *reviewItem) open() bool { return !it.OpenedAt.IsZero() && it.OpenedAt.After(it.ClosedAt) }

// decided returns the decision written for the open item, nil without one.
func (it *reviewItem) decided() *decisionRef {
	if it.Decision != nil && !it.Decision.At.Before(it.OpenedAt) {
		return it.Decision
	}
	return nil
}

// dueAt is when the owner's SLA runs out.
func (it *reviewItem) dueAt() time.Time {
	return it.OpenedAt.Add(time.Duration(it.SLAMs) * time.Millisecond)
}

// applyReview records a review-topic record: the task's item (re)opens.
func applyReview(it *reviewItem, r *event.Routed, ts time.Time) {
	if !ts.After(it.OpenedAt) {
		return
	}
	d := &r.Decision
	it.OpenedAt = ts
	it.Class, it.Route, it.Rule, it.Reason = string(d.Class), string(d.Route), d.Rule, d.Reason
	it.CostUSD = d.Totals.CostUSD
	if d.Review != nil {
		it.Owner, it.Priority, it.SLAMs = d.Review.Owner, d.Review.Priority, d.Review.SLAMs
	}
	if e := r.Event; e != nil {
		it.Provider, it.Model, it.Template, it.Action = e.Provider, e.Model, e.PromptTemplate, e.Action
		it.Attempt, it.InputRef = e.Attempt, e.InputRef
	}
	if it.Decision != nil && it.Decision.At.Before(ts) {
		it.Decision, it.Later = nil, 0
	}
}

// applyDecision records a decision-topic record for the task.
func applyDecision(it *reviewItem, d *event.ReviewDecision, ts time.Time) {
	ref := &decisionRef{Approve: d.Approve, Reviewer: d.Reviewer, Reason: d.Reason, At: ts}
	switch {
	case !it.OpenedAt.IsZero() && ts.Before(it.OpenedAt):
		// a decision for an earlier item of the task
	case it.Decision == nil:
		it.Decision = ref
	case ts.Before(it.Decision.At):
		it.Decision = ref
		it.Later++
	default:
		it.Later++
	}
}

// closes reports whether an audit record of the task closes its review
// item: a reviewer's decision, or a later event that completed or
// dead-lettered the task (a receipt resolving an unknown outcome).
func closes(d *event.Decision) bool {
	switch {
	case manual(d):
		return true
	case d.Rule == policy.RuleNoOpenItem:
		return false
	}
	return d.Route == event.RouteComplete || d.Route == event.RouteDeadLetter
}

func manual(d *event.Decision) bool {
	return d.Rule == policy.RuleManualOverride || d.Rule == policy.RuleManualRejected
}

// applyAudit records an audit record that closes the task's item: the first
// one after the item opened (before it is known, the earliest one).
func applyAudit(it *reviewItem, d *event.Decision, ts time.Time) {
	switch {
	case it.OpenedAt.IsZero() && !it.ClosedAt.IsZero() && !ts.Before(it.ClosedAt):
		return
	case !it.OpenedAt.IsZero() && !ts.After(it.OpenedAt):
		return // closes an earlier item of the task
	case !it.OpenedAt.IsZero() && it.ClosedAt.After(it.OpenedAt) && !ts.Before(it.ClosedAt):
		return // the item is closed already
	}
	it.ClosedAt = ts
	it.Closed = &closure{Route: string(d.Route), Rule: d.Rule, Reason: d.Reason, UserMessage: d.UserMessage}
}

// breakerView is one breaker as the alerts topic tells it.
type breakerView struct {
	Scope    event.BreakerScope     `json:"scope"`
	Key      string                 `json:"key"`
	State    event.BreakerStateName `json:"state"`
	Instance string                 `json:"instance"`
	Since    time.Time              `json:"since"`
	// OpenedAt and OpenReason are of the latest transition to OPEN.
	OpenedAt   time.Time `json:"opened_at"`
	OpenReason string    `json:"open_reason"`
	// Latched is a breaker that stays open until a person resets it.
	Latched  bool         `json:"latched"`
	Failures int32        `json:"failures"`
	Requests int32        `json:"requests"`
	Recent   []transition `json:"recent"` // newest first, at most maxRecent
}

// transition is one breaker transition.
type transition struct {
	From     event.BreakerStateName `json:"from"`
	To       event.BreakerStateName `json:"to"`
	Reason   string                 `json:"reason"`
	Instance string                 `json:"instance"`
	Failures int32                  `json:"failures"`
	Requests int32                  `json:"requests"`
	At       time.Time              `json:"at"`
}

const maxRecent = 8

// applyTransition records a TRANSITION alert; latched is its
// faultrouter.breaker.latched header (the reason is prose for people).
func applyTransition(b *breakerView, e *event.BreakerEvent, latched bool, ts time.Time) {
	t := transition{From: e.From, To: e.To, Reason: e.Reason, Instance: e.Instance, Failures: e.Failures, Requests: e.Requests, At: ts}
	i := 0
	for i < len(b.Recent) && b.Recent[i].At.After(ts) {
		i++
	}
	b.Recent = append(b.Recent[:i], append([]transition{t}, b.Recent[i:]...)...)
	if len(b.Recent) > maxRecent {
		b.Recent = b.Recent[:maxRecent]
	}
	if i > 0 { // an older transition read late: history only
		return
	}
	b.Scope, b.Key, b.State, b.Instance, b.Since = e.Scope, e.Key, e.To, e.Instance, ts
	b.Failures, b.Requests = e.Failures, e.Requests
	if e.To == breaker.Open.Name() {
		if e.From != breaker.Open.Name() { // OPEN to OPEN: the latch alone ended
			b.OpenedAt, b.OpenReason = ts, e.Reason
		}
		b.Latched = latched
	}
	if e.To == breaker.Closed.Name() {
		b.Latched = false
	}
}

// failureRate is the rolling window's failure ratio at the last transition.
func (b *breakerView) failureRate() string {
	if b.Requests == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%% (%d/%d)", 100*float64(b.Failures)/float64(b.Requests), b.Failures, b.Requests)
}

// alert is one record of the alerts topic.
type alert struct {
	event.BreakerEvent
	Time      time.Time `json:"time"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
}

// deadLetter is one dead-letter record: its original bytes and headers, and
// what the console filters on.
type deadLetter struct {
	Topic     string             `json:"topic"`
	Partition int32              `json:"partition"`
	Offset    int64              `json:"offset"`
	Time      time.Time          `json:"time"`
	Key       []byte             `json:"key"`
	Value     []byte             `json:"value"`
	Headers   []kgo.RecordHeader `json:"headers"`
	TaskID    string             `json:"task_id"`
	Class     string             `json:"class"`
	ErrorKind string             `json:"error_kind"`
	Message   string             `json:"message"`
	Provider  string             `json:"provider,omitempty"`
	Model     string             `json:"model,omitempty"`
	Template  string             `json:"prompt_template,omitempty"`
	Redrives  int                `json:"redrives"`
}

// id names the record in forms: topic/partition/offset.
func (d *deadLetter) id() string {
	return d.Topic + "/" + strconv.Itoa(int(d.Partition)) + "/" + strconv.FormatInt(d.Offset, 10)
}

func (d *deadLetter) key() string { return dlKey(d.Time.UnixMilli(), d.Topic, d.Partition, d.Offset) }

func dlKey(ms int64, topic string, partition int32, offset int64) string {
	return fmt.Sprintf("dl/%s/%s/%08x/%016x", timeKey(ms), topic, partition, offset)
}

// pendingRetry is a retry the router audited and has not yet published, with
// the breakers it would be published into.
type pendingRetry struct {
	TaskID    string    `json:"task_id"`
	NotBefore time.Time `json:"not_before"`
	Refs      []string  `json:"refs"` // SCOPE/key
	At        time.Time `json:"at"`   // the audit record's time
}

// retryRefs are the breakers a retry of e is published into, as SCOPE/key.
func retryRefs(e *event.TaskEvent) []string {
	if e == nil {
		return nil
	}
	var refs []string
	if e.Provider != "" || e.Model != "" {
		refs = append(refs, "PROVIDER_MODEL/"+e.Provider+"/"+e.Model)
	}
	if e.Action != "" {
		refs = append(refs, "DOWNSTREAM/"+e.Action)
	}
	if e.PromptTemplate != "" {
		refs = append(refs, "PROMPT_TEMPLATE/"+e.PromptTemplate)
	}
	return refs
}
