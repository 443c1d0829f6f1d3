package worker

import (
	"context"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// ReviewOutcome is what the router did with a reviewer's decision on a task,
// as its audit record says.
type ReviewOutcome struct {
	// TaskID is the reviewed task.
	TaskID string
	// Approved is true when the decision approved an open review item: the
	// router then publishes a retry of the task now (it arrives on the retry
	// topic).
	Approved bool
	// Rejected is true when the decision rejected an open review item: the
	// task has ended, and Decision.UserMessage holds the end-user messages.
	// Neither Approved nor Rejected: there was no open item, nothing changed.
	Rejected bool
	// Decision is the router's audited decision (rule MANUAL_OVERRIDE_SUCCESS,
	// MANUAL_REJECTED or review.no_open_item, the reason, the user message).
	Decision event.Decision
}

// ReviewOutcomes reads the router's audit records of review decisions, in a
// consumer group, at least once (as Retries).
type ReviewOutcomes struct {
	r         *reader
	decisions string
}

// NewReviewOutcomes joins group on the audit topic. A new group starts at
// the topic's beginning.
func NewReviewOutcomes(cfg Config, group string) (*ReviewOutcomes, error) {
	r, topics, err := newReader(cfg, topicspec.Audit, group)
	if err != nil {
		return nil, err
	}
	return &ReviewOutcomes{r: r, decisions: topics[topicspec.Decisions]}, nil
}

// Next blocks until the next review decision's outcome, for any task, or
// until ctx ends; the other audit records (worker events, breaker resets,
// input that did not decode) are skipped.
func (o *ReviewOutcomes) Next(ctx context.Context) (ReviewOutcome, error) {
	for {
		routed, rec, err := o.r.next(ctx)
		if err != nil {
			return ReviewOutcome{}, err
		}
		d := routed.Decision
		if routed.Input.Topic != o.decisions ||
			(d.Rule != event.RuleManualOverride && d.Rule != event.RuleManualRejected && d.Rule != event.RuleNoOpenItem) {
			continue
		}
		return ReviewOutcome{
			TaskID:   string(rec.Key), // the audit record is keyed by the decision's task ID
			Approved: d.Rule == event.RuleManualOverride,
			Rejected: d.Rule == event.RuleManualRejected,
			Decision: d,
		}, nil
	}
}

// Await returns the outcome of the next review decision on taskID, skipping
// the others (which a group shared with other tasks' waiters would lose:
// give each waiter its own group, or use Next).
func (o *ReviewOutcomes) Await(ctx context.Context, taskID string) (ReviewOutcome, error) {
	for {
		out, err := o.Next(ctx)
		if err != nil {
			return ReviewOutcome{}, err
		}
		if out.TaskID == taskID {
			return out, nil
		}
	}
}

// Close commits what was read and leaves the group.
func (o *ReviewOutcomes) Close() { o.r.close() }
