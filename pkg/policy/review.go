package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Rules of the review loop-back; the audit records carry them. They are
// declared in package event, the records' contract, so that a worker reads
// them without importing the policy.
const (
	RuleManualOverride = event.RuleManualOverride
	RuleManualRejected = event.RuleManualRejected
	RuleNoOpenItem     = event.RuleNoOpenItem
)

// DecideReview applies a reviewer's decision to the task's open review item
// and updates st. The decision's class is the class that opened the item.
//
//   - approve: route RETRY, rule MANUAL_OVERRIDE_SUCCESS, a retry due now
//     (no delay) that re-issues st.LastEvent with the same task ID; the review
//     item is APPROVED and the task is no longer terminal. The approved retry
//     counts in Retries (the totals show it) but in no class's count, and no
//     limit applies to it: a person overrode them. It grants one attempt:
//     the next failure meets the limits as they stand.
//   - reject: route COMPLETE, rule MANUAL_REJECTED, the task is terminal, the
//     item REJECTED, and UserMessage holds the end-user messages (English and
//     Chinese by default, one a line) with the reviewer's reason.
//   - an OUTCOME_UNKNOWN item is a reconciliation: the decision also records
//     the outcome of the task's WRITE operations held as unknown (reconcile).
//   - no open item (unknown task, or an item already approved, rejected or
//     resolved by a receipt): route DROP, rule review.no_open_item, audited
//     only; st is not changed.
func (p *Policy) DecideReview(rd *event.ReviewDecision, st *task.State, now time.Time) event.Decision {
	d := event.Decision{DecidedAt: event.At(now)}
	if st.TaskID == "" || st.Review != task.ReviewOpen {
		d.Class, d.Route, d.Rule = reviewClass(st), event.RouteDrop, RuleNoOpenItem
		d.Reason = fmt.Sprintf("%s for task %s: no open review item (%s); audited, nothing changes",
			verb(rd), rd.TaskID, reviewState(st))
		d.Totals = st.Totals()
		return d
	}

	d.Class = reviewClass(st)
	st.LastClass = d.Class
	st.LastSeenAt = now.UnixMilli()
	who := rd.Reviewer
	if who == "" {
		who = "a reviewer"
	}
	reconciled := ""
	if d.Class == event.ClassOutcomeUnknown {
		reconciled = reconcile(st, rd.Approve)
	}
	if rd.Approve {
		d.Route, d.Rule = event.RouteRetry, RuleManualOverride
		d.Reason = fmt.Sprintf("%s approved the %s item: %s;%s retry with the same task ID now", who, d.Class, rd.Reason, reconciled)
		d.Retry = p.retry(st, "", 0, now)
		st.Review, st.LastRoute = task.ReviewApproved, event.RouteRetry
	} else {
		d.Route, d.Rule = event.RouteComplete, RuleManualRejected
		d.Reason = fmt.Sprintf("%s rejected the %s item: %s;%s the task ends", who, d.Class, rd.Reason, reconciled)
		d.UserMessage = p.UserMessage(rd.Reason)
		st.Review, st.LastRoute, st.Pending = task.ReviewRejected, event.RouteComplete, nil
		st.Terminal, st.TerminalClass = true, d.Class
	}
	d.Totals = st.Totals()
	return d
}

// reconcile records a reviewer's reconciliation of the task's WRITE
// operations whose outcome is unknown, the subject of an OUTCOME_UNKNOWN
// item, and returns what it recorded for the decision's reason:
//
//   - approve: the write did not take effect and may run again. It is
//     PLANNED, so the retry's reports of it (SUBMITTED, UNKNOWN, CONFIRMED)
//     are recorded as they come, and an unknown outcome is held again.
//   - reject: the write is closed by a person: RECONCILED (task.OpReconciled).
//     It never runs again (a new submission of it is a DUPLICATE_EXECUTION),
//     and a receipt for it still counts, as for a held write.
//
// Either way the outcome is no longer unknown, so the task expires on its
// TTL once decided.
func reconcile(st *task.State, approve bool) string {
	to, meaning := task.OpReconciled, "closed by the reviewer, never run again"
	if approve {
		to, meaning = event.OpPlanned, "taken as not executed"
	}
	var ids []string
	for i := range st.Operations {
		if op := &st.Operations[i]; op.Unknown() {
			op.State = to
			ids = append(ids, op.OpID)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return fmt.Sprintf(" operation %s %s (%s);", strings.Join(ids, ", "), meaning, to)
}

// UserMessage is the end-user message of a task rejected for reason: the
// review loop's messages (one per language, one a line) filled with it.
func (p *Policy) UserMessage(reason string) string {
	reason = strings.TrimRight(strings.TrimSpace(reason), ".。")
	lines := make([]string, len(p.ReviewLoop.UserMessages))
	for i, m := range p.ReviewLoop.UserMessages {
		lines[i] = strings.ReplaceAll(m, "{reason}", reason)
	}
	return strings.Join(lines, "\n")
}

func reviewClass(st *task.State) event.Class {
	if st.ReviewClass != "" {
		return st.ReviewClass
	}
	return lastClass(st)
}

func verb(rd *event.ReviewDecision) string {
	if rd.Approve {
		return "approve"
	}
	return "reject"
}

func reviewState(st *task.State) string {
	switch {
	case st.TaskID == "":
		return "unknown task"
	case st.Review == task.ReviewNone:
		return "the task never went to review"
	}
	return "item already " + st.Review
}
