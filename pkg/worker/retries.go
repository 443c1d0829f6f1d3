package worker

import (
	"context"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Retry is one retry the router published on the retry topic when it was
// due: the attempt to repeat and the router's decision about it.
type Retry struct {
	// Event is the attempt the router decided to retry.
	Event event.TaskEvent
	// Decision is the router's decision: its class, rule and reason, the
	// retry plan (Decision.Retry: number and due time; nil for a retry a
	// reviewer approved), the task's running totals.
	Decision event.Decision
}

// N is the retry's number within the task's shared retry budget (0 for a
// retry a reviewer approved, which has no plan).
func (r Retry) N() int {
	if r.Decision.Retry == nil {
		return 0
	}
	return int(r.Decision.Retry.N)
}

// Feedback is what the validator said went wrong (for VALIDATION_FIXABLE,
// a JSON object with the code, its range and the message), for the next
// prompt; "" when there is none.
func (r Retry) Feedback() string { return r.Decision.Feedback }

// Model is the model the next attempt should use: the router's suggestion
// when it has one, else the model of the attempt being retried.
func (r Retry) Model() string {
	if r.Decision.SuggestedModel != "" {
		return r.Decision.SuggestedModel
	}
	return r.Event.Model
}

// Next returns the event for the next attempt: the same task, action,
// provider, prompt template, operation and attributes, attempt + 1 and the
// model to use; the outcome (Status, Stage, Error, Output, Usage) and the
// event ID and time (which Reporter.Report fills in) are left for the worker.
func (r Retry) Next() event.TaskEvent {
	e := r.Event
	e.EventID, e.OccurredAt = "", event.Timestamp{}
	e.Attempt++
	e.Model = r.Model()
	e.Stage, e.Status, e.Error, e.Output, e.Usage = "", "", nil, nil, event.Usage{}
	return e
}

// Retries delivers the retries the router publishes, in a consumer group.
// Delivery is at least once: a retry is committed when Next is called again
// or the Retries is closed, so one that was being handled when the worker
// died is delivered again (report it with the same event ID and the router
// drops the duplicate).
type Retries struct{ r *reader }

// NewRetries joins group on the retry topic. A new group starts at the
// topic's beginning.
func NewRetries(cfg Config, group string) (*Retries, error) {
	r, _, err := newReader(cfg, topicspec.Retry, group)
	if err != nil {
		return nil, err
	}
	return &Retries{r: r}, nil
}

// Next blocks until the next retry or ctx ends. A record that does not
// decode is an error wrapping the codec's; the next call goes on after it.
func (rs *Retries) Next(ctx context.Context) (Retry, error) {
	routed, _, err := rs.r.next(ctx)
	if err != nil {
		return Retry{}, err
	}
	if routed.Event == nil {
		return Retry{Decision: routed.Decision}, nil
	}
	return Retry{Event: *routed.Event, Decision: routed.Decision}, nil
}

// Close commits the retries handed out and leaves the group.
func (rs *Retries) Close() { rs.r.close() }
