// Package task holds the router's memory of one task: the event IDs it has
// seen, its attempts and retries, its running totals, its operations and its
// review status. The policy reads and updates a State; the store keeps it in
// Pebble and the changelog topic.
package task

import (
	"encoding/json"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Review states of a task.
const (
	ReviewNone     = ""
	ReviewOpen     = "OPEN"
	ReviewApproved = "APPROVED"
	ReviewRejected = "REJECTED"
	// ReviewResolved is a review item closed by a receipt (a CONFIRMED
	// operation) rather than by a person.
	ReviewResolved = "RESOLVED"
)

// OpReconciled is the state of a WRITE operation whose unknown outcome a
// person reconciled by rejecting its OUTCOME_UNKNOWN review item: it is
// never run again (a new submission of it is a duplicate execution), its
// outcome is no longer unknown (the task expires again), and a receipt
// for it (CONFIRMED or REJECTED) still counts as evidence. The task state
// alone holds it; the operation states of events are event.OpState.
const OpReconciled event.OpState = "RECONCILED"

// State is everything the router remembers about one task. Times are Unix
// milliseconds; occurred_at times come from the events, not the router clock.
type State struct {
	TaskID string `json:"task_id"`
	// SeenEvents is the dedup set: the latest MaxSeenEvents event IDs
	// routed, oldest first (see MarkSeen; a long ID is kept as a hash).
	SeenEvents []string `json:"seen,omitempty"`
	// Attempts counts the distinct events of the task.
	Attempts int32 `json:"attempts"`
	// Retries counts the retries published for the task, across all classes.
	Retries int32 `json:"retries"`
	// RetriesByClass counts the retries per class.
	RetriesByClass map[event.Class]int32 `json:"retries_by_class,omitempty"`
	// RateLimitedAt holds the occurred_at of the task's 429 answers.
	RateLimitedAt []int64 `json:"rate_limited_at,omitempty"`
	// Totals of the task's usage.
	CostUSD   float64 `json:"cost_usd"`
	Tokens    int64   `json:"tokens"`
	ElapsedMs int64   `json:"elapsed_ms"`
	// Operations are the business operations the task's events named, at
	// most MaxOperations (see AddOperation).
	Operations []Operation `json:"operations,omitempty"`
	// Review is ReviewNone, ReviewOpen, ReviewApproved, ReviewRejected or
	// ReviewResolved.
	Review string `json:"review,omitempty"`
	// ReviewClass is the class that opened the review item.
	ReviewClass event.Class `json:"review_class,omitempty"`
	// ReviewOwner and ReviewDueAt (router clock, ms) are the owner of the
	// open review item and when it is past the owner's response SLA;
	// ReviewAlerted is set once that alert was raised.
	ReviewOwner   string `json:"review_owner,omitempty"`
	ReviewDueAt   int64  `json:"review_due_at,omitempty"`
	ReviewAlerted bool   `json:"review_alerted,omitempty"`
	// Terminal is set once the task reached a terminal decision.
	Terminal bool `json:"terminal,omitempty"`
	// TerminalClass is the class of the decision that made the task terminal;
	// later DUPLICATE_EXECUTION events do not overwrite it.
	TerminalClass event.Class `json:"terminal_class,omitempty"`
	// LastClass and LastRoute are the latest decision's class and route.
	LastClass event.Class `json:"last_class,omitempty"`
	LastRoute event.Route `json:"last_route,omitempty"`
	// FirstEventAt is the occurred_at of the task's first event (ms).
	FirstEventAt int64 `json:"first_event_at,omitempty"`
	// LastEventAt is the occurred_at of the latest event (ms).
	LastEventAt int64 `json:"last_event_at"`
	// LastSeenAt is the router clock when the latest event was routed (ms).
	LastSeenAt int64 `json:"last_seen_at"`
	// SLAMs is the task's SLA; state expires 2 x SLA after LastSeenAt.
	SLAMs int64 `json:"sla_ms,omitempty"`
	// ExpiresAt is the router-clock time (ms) the state expires; 0 for never
	// (an operation with an unknown outcome keeps its task).
	ExpiresAt int64 `json:"expires_at,omitempty"`
	// Pending is a retry waiting for its due time.
	Pending *PendingRetry `json:"pending,omitempty"`
	// Traceparent is the W3C trace context of the latest input record, carried
	// to the retry published when it is due.
	Traceparent string `json:"traceparent,omitempty"`
	// LastEvent is a bounded copy of the latest input event (SetLastEvent),
	// kept to publish a retry when it is due or on approval.
	LastEvent *event.TaskEvent `json:"last_event,omitempty"`
	// LastEventTruncated names the fields of LastEvent cut to fit the
	// bounds, e.g. output.text; empty when the copy is whole.
	LastEventTruncated []string `json:"last_event_truncated,omitempty"`
	// LastInput is the input record LastEvent came from: the whole event is
	// there (for the input topic's retention).
	LastInput *event.Source `json:"last_input,omitempty"`
}

// Operation is what the router knows of one business operation.
type Operation struct {
	OpID         string        `json:"op_id"`
	Kind         event.OpKind  `json:"kind"`
	ParamsSHA256 string        `json:"params_sha256,omitempty"`
	State        event.OpState `json:"state"`
}

// PendingRetry is a retry decided but not yet due.
type PendingRetry struct {
	N         int32 `json:"n"`
	DelayMs   int64 `json:"delay_ms"`
	NotBefore int64 `json:"not_before"`
	// DueAt is the retry's own due time (router-clock ms) once a breaker
	// holding it has moved NotBefore later; 0 while it has not.
	DueAt int64 `json:"due_at,omitempty"`
}

// Due is the retry's own due time: the order of the due index among retries
// with the same NotBefore, so that held retries released together come out in
// the order they were due.
func (p *PendingRetry) Due() int64 {
	if p.DueAt != 0 {
		return p.DueAt
	}
	return p.NotBefore
}

// Reopen starts a new episode of the task, on an operator's re-drive: the
// task is no longer terminal, an open review item is closed, a pending retry
// is dropped, and the retry budget (also per class), the rate-limit window
// and the usage totals start afresh. What the task remembers of its history
// stays: the attempts count, the dedup set and the operations (a WRITE whose
// outcome is unknown stays held; PARAMS_MISMATCH still compares with the
// approved parameters).
func (s *State) Reopen() {
	s.Terminal, s.TerminalClass = false, ""
	s.Review, s.ReviewClass = ReviewNone, ""
	s.ReviewOwner, s.ReviewDueAt, s.ReviewAlerted = "", 0, false
	s.Pending = nil
	s.Retries, s.RetriesByClass, s.RateLimitedAt = 0, nil, nil
	s.CostUSD, s.Tokens, s.ElapsedMs = 0, 0, 0
}

// Totals returns the decision totals of the task.
func (s *State) Totals() event.Totals {
	return event.Totals{Attempts: s.Attempts, Retries: s.Retries, CostUSD: s.CostUSD, Tokens: s.Tokens, ElapsedMs: s.ElapsedMs}
}

// Marshal encodes the state for the store and the changelog.
func (s *State) Marshal() ([]byte, error) { return json.Marshal(s) }

// Unmarshal decodes a state written by Marshal.
func Unmarshal(b []byte) (*State, error) {
	s := new(State)
	if err := json.Unmarshal(b, s); err != nil {
		return nil, err
	}
	return s, nil
}
