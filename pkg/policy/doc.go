// Package policy is faultrouter's judgement: it classifies one task event in
// the light of the task's history and decides the one next step (retry,
// review, quarantine, dead letter, complete or drop). It does no I/O: Decide,
// DecideReview and Drop are functions of the event, the task state and the
// router's clock, tested with golden files under testdata/.
//
// The decisions the router makes on its own are here too, as pure functions
// (commands.go): Poison (a record it cannot accept), RetryDue (a pending
// retry whose time has come), BreakerCommand and BreakerCommandApplied (a
// RESET or LATCH on the decisions topic) and Forward (a record on the wrong
// partition for its task); and which decided events count as failures or
// successes of which breaker (breakers.go: BreakerOutcomes, BreakerFailure,
// LatchesTemplate, ReviewResetsTemplate).
//
// The numbers, phrase lists, code ranges and review owners come from a Policy:
// Default() is the policy of docs/design.md; Parse and ParseFile read the
// bytes of a YAML policy file, which the caller reads (default-policy.yaml is
// the commented default, `faultrouter policy default` prints it).
//
// # Precedence
//
// An event can match several rules (a 504 on a write whose receipt was lost,
// a refusal that also blew the budget). The first rule in this order decides:
//
//  1. PARAMS_MISMATCH: the event names a known op_id with another
//     params_sha256 than the first one recorded (the approved one), unless
//     the task ended for good (then rule 3). Checked first, so that a
//     fail-over model proposing other parameters for a held write is named
//     for what it is; such parameters never run.
//  2. Receipt for a held operation: a known WRITE op_id the router holds as
//     SUBMITTED or UNKNOWN is now CONFIRMED (SUCCEEDED, COMPLETE; an open
//     review item is resolved) or REJECTED (BUSINESS_REJECTED, review). A
//     receipt is evidence, not an execution, so it counts even for a task that
//     ended or is in review.
//  3. Terminal task: any other event for a terminal task (ended, or waiting
//     in review) is DUPLICATE_EXECUTION, COMPLETE, audit only; the task's
//     ending, review item and LastEvent are kept.
//  4. A WRITE op_id already CONFIRMED submitted again: DUPLICATE_EXECUTION.
//  5. OUTCOME_UNKNOWN: a WRITE operation SUBMITTED or UNKNOWN. Before any
//     error class, so that a timeout on a write is held, never retried.
//  6. Operation REJECTED: BUSINESS_REJECTED.
//  7. MODEL_HALLUCINATION: a quarantine flag on the output. Safety first:
//     even a downstream duplicate's output is quarantined and alerted.
//  8. Downstream duplicate: 409, duplicate_task_id, already_processed.
//  9. MODEL_REFUSAL: a refusal phrase in output.text, or confidence below
//     the minimum (0.75 passes, 0.7499 does not). Before success: an OK
//     status carrying a refusal is a refusal.
//  10. SUCCEEDED: status OK and output.schema_valid not false. A success
//     completes even over budget: it needs no more spending.
//  11. BUDGET_EXHAUSTED: a failed attempt of a task whose totals reached a
//     limit. Before every retryable class, so that nothing retries past it.
//  12. VALIDATION_FIXABLE: a validator code in a configured range. Before
//     SCHEMA_VIOLATION: a structured code is the more precise diagnosis and
//     carries feedback a retry can use.
//  13. SCHEMA_VIOLATION: output.schema_valid false or a schema code.
//  14. The error classes, by error: RATE_LIMITED (429), AUTH_FAILED (401,
//     403, token codes), NETWORK_TIMEOUT (timeouts, 502-504),
//     BUSINESS_REJECTED (business codes; 400/422 at stage BUSINESS),
//     INPUT_QUALITY_ISSUE (input codes; 400 at any other stage, null
//     included).
//  15. UNCLASSIFIED: nothing matched; to review.
//
// # Decisions
//
// Per-class limits count the retries of that class (State.RetriesByClass);
// on top of them one shared budget (retry_budget, default 4) counts the
// task's retries across classes: a retry past it becomes DEADLETTER with rule
// budget.retries_exhausted and the original class. Retries that exhaust a
// class go to DEADLETTER (NETWORK_TIMEOUT, RATE_LIMIT_EXCEEDED, both
// infrastructure failures no person can fix per task) or to review
// (AUTH_FAILED to security, VALIDATION_FIXABLE).
//
// A retry plan's N is the task's retry number across classes (it equals
// totals.retries); DelayMs is the class's delay; NotBefore is the router's
// clock plus the delay, so that consumer lag never makes a retry early.
// RATE_LIMITED honours retry_after_ms the same way, up to the ceiling
// rate_limited.max_retry_after_ms (default 1 h): a longer wait is capped at
// it, and the decision's reason says so. No configured delay may exceed
// MaxRetryDelayMs (30 days); the delay is added in milliseconds, so no
// retry_after_ms, however large, can overflow into a retry in the past.
//
// Every route except RETRY makes the task terminal: COMPLETE, DEADLETTER,
// REVIEW and QUARANTINE. A task in review waits for a person; only an
// approval (DecideReview) or a receipt for a held operation moves it on.
//
// Windows and budgets use the events' occurred_at and usage, never the
// router's clock: a second 429 at most 60 000 ms after another (59 s is,
// 61 s is not) is RATE_LIMIT_EXCEEDED; a budget limit is reached when the
// total is greater than or equal to it, money compared in whole
// micro-dollars (so $0.50 exactly is exhausted, $0.499999 is not).
//
// REVIEW and QUARANTINE decisions carry the class's owner, the owner's
// response SLA and a priority. Defaults: AUTH_FAILED security (high);
// INPUT_QUALITY_ISSUE product_operations; MODEL_REFUSAL, SCHEMA_VIOLATION
// and VALIDATION_FIXABLE ai_product; BUSINESS_REJECTED and UNCLASSIFIED
// operations; BUDGET_EXHAUSTED, OUTCOME_UNKNOWN and PARAMS_MISMATCH
// operations (high); MODEL_HALLUCINATION content_safety (high, SLA 1 min).
//
// Exact redeliveries (the same event_id) never reach Decide: the router
// routes them with Drop (DROP, rule dedup.redelivery, class of the task's
// latest decision).
//
// The review loop-back (DecideReview): approve re-issues one retry with no
// delay (rule MANUAL_OVERRIDE_SUCCESS), counted in the task's retries but
// checked against no limit; reject ends the task with COMPLETE (rule
// MANUAL_REJECTED) and the end-user messages; a decision without an open item
// is DROP, rule review.no_open_item, and changes nothing. All three carry the
// class of the review item they answer.
//
// # Overrides
//
// Providers and models fail differently, so a policy may hold overrides
// (override.go): each has a name, a match on the event's provider, model,
// action and prompt_template, and class sections in the top-level sections'
// keys. A section's given keys replace the base's; every other key, and
// every section not named, is the base's.
//
//	overrides:
//	  - name: acme-timeouts
//	    match: {provider: acme}            # missing keys and "*" match any value
//	    network_timeout: {max_retries: 1}
//	    model_refusal: {min_confidence: 0.6}
//
// A match value is an exact value (case matters), "*", or a prefix ending in
// "*" ("gpt-4*" matches gpt-4, gpt-4o, gpt-4.1). An event with no provider
// (or model, ...) matches only "*" there. Specificity is the number of match
// fields other than "*" (a prefix counts as one, like an exact value); the
// most specific override matching an event decides it, and only it (its
// sections, the base's others: overrides do not stack). Two overrides of
// equal specificity that one event could match are an error naming both
// (Validate, `policy check`), whatever the events the router sees: make one
// more specific or their matches exclusive. So "gpt-4*" and "gpt-4o" on
// model alone are ambiguous; add a field to the one that should win.
// A match must set at least one field, and an override must change at
// least one section.
//
// Only class sections are overridable. The shared retry budget, the task
// budget (budget_exhausted: one per task, whose attempts may run on
// different models), the breakers (they already count per provider/model,
// action and prompt template, and have no per-class limits), the owners and
// their SLAs, surge, cost_prevented, review_loop and default_sla_ms are the
// base's for every event; an override setting one is an error saying so. An
// override's sections name owners of the top-level owners.
//
// Each event is decided with the override matching it, against the task's
// history as it stands: class retry counts (RetriesByClass) are the task's,
// whichever override made them, so a task whose attempts change model meets
// each attempt's limit with the retries already made. Decide names the
// override on the decision (event.Decision.Override, decision.override on
// the audit and routed records) for every decision it made under that
// override's settings, whatever the class; a decision under the base policy
// names none. The overrides are compiled once by Validate; choosing one per
// event compares the four fields with each override, most specific first,
// and allocates nothing, and a policy without overrides skips the search.
package policy
