package checker

import (
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Decided is one task input as Replay decided it: the decision the router
// recorded in its audit record and the one the policy computes.
type Decided struct {
	Task string
	// Input names the input record: topic/partition@offset.
	Input string
	// At is when the router decided it (the audit record's decided_at).
	At time.Time
	// Event is the input's task event; nil for a review decision.
	Event *event.TaskEvent
	// Review is the input's review decision; nil for a task event.
	Review *event.ReviewDecision
	// Audited reports whether the input has an audit record; Recorded is
	// its decision.
	Audited  bool
	Recorded event.Decision
	// Model is the decision the policy computes, on the task's state carried
	// from its earlier inputs of the logs; zero when the model could not go on
	// with the task (an earlier input has no audit record).
	Model event.Decision
	// Diff names the first difference between Recorded and Model, "" when
	// they agree.
	Diff string
	// Repeat says, for a task event the model decided, why its attempt is
	// not counted again (policy.RepeatOf), "" when it is.
	Repeat policy.Repeat
	// Fresh reports that the model's state of the task had expired (its
	// TTL) before this input, which was decided on a fresh state; Estimated
	// that the expiry check before it took a retry's publication time at
	// its due time, the retry topic holding none (another policy's retry).
	Fresh, Estimated bool
}

// Replay decides the task inputs of logs (Ingress, Decisions and Audit, and
// Retry for the publication times of retries; the other output topics are
// not read) with o.Policy, each task's inputs in the order the router
// decided them and on the task state carried from its earlier inputs,
// exactly as Check does, the TTL included: a task's state expires 2 x SLA
// after its last decision or the publication of its pending retry, read
// from the retry topic (a breaker's hold included) for a retry the router
// published, else taken at the retry's due time (Decided.Estimated). It
// returns every task event and review decision, tasks in the order of their
// first input. Replaying the same logs with two policies gives two lists of
// the same inputs in the same order: a what-if.
func Replay(logs Logs, o Options) ([]Decided, error) {
	logs.Review, logs.DeadLetter, logs.Alerts = nil, nil, nil
	o.MaxViolations = 1
	ck, err := newChecker(logs, o)
	if err != nil {
		return nil, err
	}
	ck.replay = true
	ck.readInputs()
	ck.readAudit()
	ck.indexPublished()
	ck.model()
	var out []Decided
	for _, id := range ck.order {
		tr := ck.tasks[id]
		stopped := false
		for _, in := range tr.inputs {
			d := Decided{Task: id, Input: in.key.String()}
			switch in.kind {
			case inTask:
				d.Event = &in.event
			case inReview:
				d.Review = &in.review
			}
			if in.audit == nil {
				d.Diff = "no audit record: the model cannot go on with this task"
				stopped = true
			} else {
				d.Audited, d.Recorded, d.At = true, in.audit.r.Decision, in.audit.at()
				if stopped {
					d.Diff = "an earlier input of the task has no audit record"
				} else {
					d.Model, d.Repeat, d.Fresh, d.Estimated = in.decided, in.repeat, in.fresh, in.estimated
					d.Diff = diffDecision(d.Recorded, d.Model)
				}
			}
			out = append(out, d)
		}
	}
	return out, nil
}
