package policy

import (
	"fmt"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// The rules about business operations (attempts vs operations):
// parameters that changed, receipts, unknown outcomes, rejections.

func (p *Policy) paramsMismatch(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	op := ev.Operation
	if op == nil || op.ParamsSHA256 == "" {
		return verdict{}, false
	}
	if st.Terminal && st.Review != task.ReviewOpen {
		return verdict{}, false // the task ended: DUPLICATE_EXECUTION
	}
	known := st.Op(op.OpID)
	if known == nil || known.ParamsSHA256 == "" || known.SameParams(op.ParamsSHA256) {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassParamsMismatch, route: event.RouteReview, rule: RuleParamsMismatch,
		reason: fmt.Sprintf("operation %s proposes params_sha256 %s but %s was approved; the approved parameters stand and these are never executed",
			op.OpID, short(op.ParamsSHA256), short(known.ParamsSHA256)),
		esc:           p.ParamsMismatch,
		keepLastEvent: true,
	}, true
}

// heldOperationReceipt resolves an operation the router holds as SUBMITTED or
// UNKNOWN, or that a reviewer reconciled (task.OpReconciled). A receipt is
// evidence about the world, not an execution, so it counts even when the
// task is terminal or in review.
func (p *Policy) heldOperationReceipt(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	op := ev.Operation
	if op == nil {
		return verdict{}, false
	}
	known := st.Op(op.OpID)
	if known == nil || known.Kind != event.OpWrite || !held(known.State) && known.State != task.OpReconciled {
		return verdict{}, false
	}
	switch op.State {
	case event.OpConfirmed:
		return verdict{
			class: event.ClassSucceeded, route: event.RouteComplete, rule: RuleOutcomeConfirmed,
			reason: fmt.Sprintf("receipt: operation %s held as %s is CONFIRMED; the task is complete and any open review item is resolved", op.OpID, known.State),
		}, true
	case event.OpRejected:
		return verdict{
			class: event.ClassBusinessRejected, route: event.RouteReview, rule: RuleOutcomeRejected,
			reason: fmt.Sprintf("receipt: operation %s held as %s was REJECTED by the business system; never retried", op.OpID, known.State),
			esc:    p.BusinessRejected.Escalation,
		}, true
	}
	return verdict{}, false
}

func (p *Policy) terminalTask(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	if !st.Terminal {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassDuplicateExecution, route: event.RouteComplete, rule: RuleDuplicateTerminalTask,
		reason:    "task already ended as " + string(terminalClass(st)) + "; a new event for it is a duplicate execution, audited only",
		auditOnly: true,
	}, true
}

func (p *Policy) confirmedOperationResubmitted(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	op := ev.Operation
	if op == nil || (op.State != event.OpSubmitted && op.State != event.OpUnknown) {
		return verdict{}, false
	}
	known := st.Op(op.OpID)
	if known == nil || known.State != event.OpConfirmed && known.State != task.OpReconciled {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassDuplicateExecution, route: event.RouteComplete, rule: RuleDuplicateOperationConfirmed,
		reason: fmt.Sprintf("operation %s was already %s; submitting it again is a duplicate execution", op.OpID, known.State),
	}, true
}

func (p *Policy) outcomeUnknown(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	op := ev.Operation
	if op == nil || op.Kind != event.OpWrite || !held(op.State) {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassOutcomeUnknown, route: event.RouteReview, rule: RuleOutcomeUnknownHold,
		reason: fmt.Sprintf("WRITE operation %s is %s with no receipt: held for reconciliation, never retried automatically", op.OpID, op.State),
		esc:    p.OutcomeUnknown,
	}, true
}

func (p *Policy) operationRejected(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	op := ev.Operation
	if op == nil || op.State != event.OpRejected {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassBusinessRejected, route: event.RouteReview, rule: RuleOperationRejected,
		reason: fmt.Sprintf("operation %s was REJECTED by the business system; never retried", op.OpID),
		esc:    p.BusinessRejected.Escalation,
	}, true
}

func terminalClass(st *task.State) event.Class {
	if st.TerminalClass != "" {
		return st.TerminalClass
	}
	return lastClass(st)
}

// held reports whether an operation's outcome is not known yet.
func held(s event.OpState) bool { return s == event.OpSubmitted || s == event.OpUnknown }
