// Rule names: the audit record of every decision carries one
// (decision.rule), and tools, tests and dashboards match on them, so each is
// spelled here once. The review loop-back's are in review.go.

package policy

import "github.com/faultrouter/faultrouter/pkg/event"

// Rules of the failure classes' decisions (Decide).
const (
	RuleUnclassified                = "unclassified.no_rule"
	RuleDuplicateDownstream         = "duplicate_execution.downstream"
	RuleHallucinationQuarantine     = "model_hallucination.quarantine"
	RuleRefusalPhrase               = "model_refusal.phrase"
	RuleRefusalLowConfidence        = "model_refusal.low_confidence"
	RuleSucceeded                   = "succeeded.complete"
	RuleBudgetExhausted             = "budget_exhausted.review"
	RuleValidationReviewRange       = "validation_fixable.review_range"
	RuleValidationExhausted         = "validation_fixable.exhausted"
	RuleValidationRetry             = "validation_fixable.retry"
	RuleSchemaViolationOutput       = "schema_violation.output"
	RuleSchemaViolationCode         = "schema_violation.code"
	RuleRateLimitExceeded           = "rate_limit_exceeded.deadletter"
	RuleRateLimitedRetry            = "rate_limited.retry"
	RuleAuthFailedReview            = "auth_failed.review"
	RuleAuthFailedRetry             = "auth_failed.refresh_retry"
	RuleNetworkTimeoutExhausted     = "network_timeout.exhausted"
	RuleNetworkTimeoutRetry         = "network_timeout.retry"
	RuleBusinessRejected            = "business_rejected.review"
	RuleInputQuality                = "input_quality_issue.review"
	RuleParamsMismatch              = "params_mismatch.review"
	RuleOutcomeConfirmed            = "outcome_unknown.confirmed"
	RuleOutcomeRejected             = "outcome_unknown.rejected"
	RuleOutcomeUnknownHold          = "outcome_unknown.hold"
	RuleOperationRejected           = "business_rejected.operation_rejected"
	RuleDuplicateTerminalTask       = "duplicate_execution.terminal_task"
	RuleDuplicateOperationConfirmed = "duplicate_execution.operation_confirmed"
)

// Rules over and beside the classes': the shared retry budget, dedup, due
// retries and forwarding.
const (
	RuleRetryBudgetExhausted = "budget.retries_exhausted" // the task's retry budget is spent: dead letter
	RuleRedelivery           = "dedup.redelivery"         // an event the task has already seen: dropped
	RuleRetryDue             = "retry.due"                // a pending retry whose time has come: published
	RuleRetryHeldExpired     = "retry.held_expired"       // a retry held behind breakers past its task's lifetime: dead letter
	RulePartitionForward     = "partition.forward"        // a record on the wrong partition for its task: forwarded
)

const (
	ruleInputPrefix   = "input."   // input.<kind>: a record the router cannot accept (Poison)
	ruleOutputPrefix  = "output."  // output.<kind>: an input whose outputs the broker refused
	ruleBreakerPrefix = "breaker." // breaker.latch, breaker.reset, breaker.<command>_invalid
)

// InputRule is the rule of a record the router cannot accept, of kind kind
// (Poison): input.<kind>.
func InputRule(kind string) string { return ruleInputPrefix + kind }

// OutputRule is the rule of an input whose outputs the broker refused, of
// kind kind: output.<kind>.
func OutputRule(kind string) string { return ruleOutputPrefix + kind }

// breakerRule is the rule of a breaker command of kind kind: breaker.latch
// or breaker.reset.
func breakerRule(kind string) string {
	if kind == event.BreakerKindLatch {
		return ruleBreakerPrefix + "latch"
	}
	return ruleBreakerPrefix + "reset"
}
