package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// verdict is what one classification rule concluded, before the shared retry
// budget and the state update.
type verdict struct {
	class  event.Class
	route  event.Route
	rule   string
	reason string
	// delayMs is the retry delay when route is RETRY.
	delayMs int64
	// esc is the reviewer when route is REVIEW or QUARANTINE.
	esc            Escalation
	feedback       string
	suggestedModel string
	// auditOnly leaves the task's terminal, review, operation and last-event
	// state as it was (an event for a task that already ended).
	auditOnly bool
	// keepLastEvent keeps st.LastEvent (the event an approval re-issues) when
	// the new event must never be executed (PARAMS_MISMATCH).
	keepLastEvent bool
	// rateLimited records the event's occurred_at as a 429 of the task.
	rateLimited bool
}

// rule is one step of the classification. It sees the event and the task
// state after the event's usage was added to the totals, and before any other
// update. It reports whether it decided.
type rule func(p *Policy, ev *event.TaskEvent, st *task.State) (verdict, bool)

// precedence is the classification order: the first rule that matches
// decides. The package documentation explains the order.
var precedence = []rule{
	(*Policy).paramsMismatch,
	(*Policy).heldOperationReceipt,
	(*Policy).terminalTask,
	(*Policy).confirmedOperationResubmitted,
	(*Policy).outcomeUnknown,
	(*Policy).operationRejected,
	(*Policy).hallucination,
	(*Policy).downstreamDuplicate,
	(*Policy).refusal,
	(*Policy).succeeded,
	(*Policy).budgetExhausted,
	(*Policy).validationCode,
	(*Policy).schemaViolation,
	(*Policy).rateLimited,
	(*Policy).authFailed,
	(*Policy).networkTimeout,
	(*Policy).businessRejected,
	(*Policy).inputQuality,
}

// classify runs the rules in precedence order; UNCLASSIFIED when none
// matches.
func (p *Policy) classify(ev *event.TaskEvent, st *task.State) verdict {
	for _, r := range precedence {
		if v, ok := r(p, ev, st); ok {
			return v
		}
	}
	return verdict{
		class: event.ClassUnclassified, route: event.RouteReview, rule: RuleUnclassified,
		reason: fmt.Sprintf("%s matches no rule; a person classifies it", describeOutcome(ev)),
		esc:    p.Unclassified,
	}
}

// --- duplicates and output checks ---

func (p *Policy) downstreamDuplicate(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	m, ok := p.DuplicateExecution.match(ev.Error)
	if !ok {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassDuplicateExecution, route: event.RouteComplete, rule: RuleDuplicateDownstream,
		reason: fmt.Sprintf("downstream reports the work was already done (%s); the task ends, audited only", m),
	}, true
}

func (p *Policy) hallucination(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	if ev.Output == nil {
		return verdict{}, false
	}
	for _, f := range ev.Output.Flags {
		if containsFold(p.Hallucination.Flags, f) {
			return verdict{
				class: event.ClassHallucination, route: event.RouteQuarantine, rule: RuleHallucinationQuarantine,
				reason: fmt.Sprintf("output flagged %s: output quarantined, prompt template breaker opens until a person resets it", f),
				esc:    p.Hallucination.Escalation,
			}, true
		}
	}
	return verdict{}, false
}

func (p *Policy) refusal(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	out := ev.Output
	if out == nil {
		return verdict{}, false
	}
	v := verdict{class: event.ClassModelRefusal, route: event.RouteReview, esc: p.ModelRefusal.Escalation}
	if phrase, ok := p.phrases().match(out.Text); ok {
		v.rule = RuleRefusalPhrase
		v.reason = fmt.Sprintf("output.text matches refusal phrase %q: terminal, a retry would be refused again", phrase)
		return v, true
	}
	if c := out.Confidence; c != nil && *c < p.ModelRefusal.MinConfidence {
		v.rule = RuleRefusalLowConfidence
		v.reason = fmt.Sprintf("output.confidence %v is below %v: terminal, a retry would not be surer", *c, p.ModelRefusal.MinConfidence)
		return v, true
	}
	return verdict{}, false
}

func (p *Policy) succeeded(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	if ev.Status != event.StatusOK || (ev.Output != nil && ev.Output.SchemaValid != nil && !*ev.Output.SchemaValid) {
		return verdict{}, false
	}
	return verdict{
		class: event.ClassSucceeded, route: event.RouteComplete, rule: RuleSucceeded,
		reason: "status OK and the output checks passed: the task is complete",
	}, true
}

// budgetExhausted applies to a failed attempt only: a success needs no more
// spending, so it completes even over budget.
func (p *Policy) budgetExhausted(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	b := &p.Budget
	var over string
	switch {
	case micros(st.CostUSD) >= micros(b.MaxCostUSD):
		over = fmt.Sprintf("cost $%s reached the task budget of $%s", dollars(st.CostUSD), dollars(b.MaxCostUSD))
	case st.Tokens >= b.MaxTokens:
		over = fmt.Sprintf("%d tokens reached the task budget of %d", st.Tokens, b.MaxTokens)
	case st.ElapsedMs >= b.MaxElapsedMs:
		over = fmt.Sprintf("%d ms elapsed reached the task budget of %d ms", st.ElapsedMs, b.MaxElapsedMs)
	default:
		return verdict{}, false
	}
	return verdict{
		class: event.ClassBudgetExhausted, route: event.RouteReview, rule: RuleBudgetExhausted,
		reason: fmt.Sprintf("%s after %s: no more automatic attempts, to review at once", over, describeOutcome(ev)),
		esc:    b.Escalation,
	}, true
}

func (p *Policy) validationCode(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	vf := &p.ValidationFixable
	if ev.Error == nil {
		return verdict{}, false
	}
	code := ev.Error.Code
	if len(code) <= len(vf.CodePrefix) || !strings.EqualFold(code[:len(vf.CodePrefix)], vf.CodePrefix) {
		return verdict{}, false
	}
	n, err := strconv.Atoi(code[len(vf.CodePrefix):])
	if err != nil || n < 0 {
		return verdict{}, false
	}
	i := slices.IndexFunc(vf.Ranges, func(r CodeRange) bool { return r.From <= n && n <= r.To })
	if i < 0 {
		return verdict{}, false // a code outside every range falls through to UNCLASSIFIED
	}
	r := vf.Ranges[i]
	v := verdict{class: event.ClassValidationFixable, esc: vf.Escalation}
	if r.Route == event.RouteReview {
		v.route, v.rule = event.RouteReview, RuleValidationReviewRange
		v.reason = fmt.Sprintf("validator code %s is in the %s range %d-%d, which a person decides", code, r.Name, r.From, r.To)
		return v, true
	}
	used := st.RetriesByClass[event.ClassValidationFixable]
	if used >= vf.MaxRetries {
		v.route, v.rule = event.RouteReview, RuleValidationExhausted
		v.reason = "validator code " + code + " (" + r.Name + ") after " + itoa(int64(used)) + " of " + itoa(int64(vf.MaxRetries)) + " feedback retries: to review"
		return v, true
	}
	v.route, v.rule, v.delayMs = event.RouteRetry, RuleValidationRetry, vf.DelayMs
	v.feedback = feedback(ev.Error, r)
	v.suggestedModel = r.SuggestedModel
	v.reason = "validator code " + code + " (" + r.Name + "): feedback retry " + itoa(int64(used+1)) + " of " + itoa(int64(vf.MaxRetries))
	if r.SuggestedModel != "" {
		v.reason += " with model " + r.SuggestedModel
	}
	return v, true
}

// feedback is the validator's structured feedback carried to the retry.
func feedback(e *event.Error, r CodeRange) string {
	b, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Range   string `json:"range,omitempty"`
		Message string `json:"message,omitempty"`
	}{e.Code, r.Name, e.Message})
	return string(b)
}

func (p *Policy) schemaViolation(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	v := verdict{class: event.ClassSchemaViolation, route: event.RouteReview, esc: p.SchemaViolation.Escalation}
	if out := ev.Output; out != nil && out.SchemaValid != nil && !*out.SchemaValid {
		v.rule, v.reason = RuleSchemaViolationOutput, "output.schema_valid is false: terminal, a retry of the same prompt repeats the defect"
		return v, true
	}
	if ev.Error != nil && containsFold(p.SchemaViolation.Codes, ev.Error.Code) {
		v.rule, v.reason = RuleSchemaViolationCode, fmt.Sprintf("error.code %s: the output breaks its schema; terminal", ev.Error.Code)
		return v, true
	}
	return verdict{}, false
}

// --- error classes ---

func (p *Policy) rateLimited(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	rl := &p.RateLimited
	m, ok := rl.match(ev.Error)
	if !ok {
		return verdict{}, false
	}
	at := ev.OccurredAt.Millis()
	for _, prev := range st.RateLimitedAt {
		if gap := abs(at - prev); gap <= rl.WindowMs {
			return verdict{
				class: event.ClassRateLimitExceeded, route: event.RouteDeadLetter, rule: RuleRateLimitExceeded,
				reason:      fmt.Sprintf("second rate limit (%s) %d ms after the previous one, within %d ms: terminal", m, gap, rl.WindowMs),
				rateLimited: true,
			}, true
		}
	}
	v := verdict{class: event.ClassRateLimited, route: event.RouteRetry, rule: RuleRateLimitedRetry, rateLimited: true}
	if ra := ev.Error.RetryAfterMs; ra != nil && *ra > rl.MaxRetryAfterMs {
		v.delayMs = rl.MaxRetryAfterMs
		v.reason = fmt.Sprintf("rate limited (%s): retry_after_ms %d is above the ceiling rate_limited.max_retry_after_ms: retry after %d ms", m, *ra, rl.MaxRetryAfterMs)
	} else if ra != nil && *ra >= 0 {
		v.delayMs = *ra
		v.reason = "rate limited (" + m + "): retry after retry_after_ms " + itoa(*ra)
	} else {
		v.delayMs = rl.DefaultDelayMs
		v.reason = "rate limited (" + m + ") without retry_after_ms: retry after " + itoa(rl.DefaultDelayMs) + " ms"
	}
	return v, true
}

func (p *Policy) authFailed(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	af := &p.AuthFailed
	m, ok := af.match(ev.Error)
	if !ok {
		return verdict{}, false
	}
	used := st.RetriesByClass[event.ClassAuthFailed]
	if used >= af.MaxRetries {
		return verdict{
			class: event.ClassAuthFailed, route: event.RouteReview, rule: RuleAuthFailedReview,
			reason: "authentication failed again (" + m + ") after " + itoa(int64(used)) + " credentials-refresh retries: terminal, to security",
			esc:    af.Escalation,
		}, true
	}
	return verdict{
		class: event.ClassAuthFailed, route: event.RouteRetry, rule: RuleAuthFailedRetry, delayMs: af.DelayMs,
		reason: "authentication failed (" + m + "): refresh credentials and retry " + itoa(int64(used+1)) + " of " + itoa(int64(af.MaxRetries)) + " with the same task ID",
	}, true
}

func (p *Policy) networkTimeout(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	nt := &p.NetworkTimeout
	m, ok := nt.match(ev.Error)
	if !ok {
		return verdict{}, false
	}
	used := st.RetriesByClass[event.ClassNetworkTimeout]
	if used >= nt.MaxRetries {
		return verdict{
			class: event.ClassNetworkTimeout, route: event.RouteDeadLetter, rule: RuleNetworkTimeoutExhausted,
			reason: "network failure (" + m + ") after " + itoa(int64(used)) + " of " + itoa(int64(nt.MaxRetries)) + " retries: terminal, dead letter",
		}, true
	}
	n := used + 1
	delay := backoff(nt.BaseDelayMs, nt.MaxDelayMs, n)
	return verdict{
		class: event.ClassNetworkTimeout, route: event.RouteRetry, rule: RuleNetworkTimeoutRetry, delayMs: delay,
		reason: "transient network failure (" + m + "): retry " + itoa(int64(n)) + " of " + itoa(int64(nt.MaxRetries)) + " after " + itoa(delay) + " ms",
	}, true
}

// backoff is min(base x 2^(n-1), max) for retry n >= 1.
func backoff(base, max int64, n int32) int64 {
	d := base
	for i := int32(1); i < n && d < max; i++ {
		if d > max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

func (p *Policy) businessRejected(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	br := &p.BusinessRejected
	e := ev.Error
	if e == nil {
		return verdict{}, false
	}
	var m string
	switch {
	case containsFold(br.Codes, e.Code):
		m = "error.code " + e.Code
	case containsFold(br.Types, e.Type):
		m = "error.type " + e.Type
	case slices.Contains(br.HTTPStatuses, e.HTTPStatus) && slices.Contains(br.Stages, ev.Stage):
		m = fmt.Sprintf("HTTP %d at stage %s", e.HTTPStatus, ev.Stage)
	default:
		return verdict{}, false
	}
	return verdict{
		class: event.ClassBusinessRejected, route: event.RouteReview, rule: RuleBusinessRejected,
		reason: fmt.Sprintf("the business system rejected the request (%s): never retried, to review", m),
		esc:    br.Escalation,
	}, true
}

func (p *Policy) inputQuality(ev *event.TaskEvent, st *task.State) (verdict, bool) {
	iq := &p.InputQuality
	e := ev.Error
	if e == nil {
		return verdict{}, false
	}
	var m string
	switch {
	case containsFold(iq.Codes, e.Code):
		m = "error.code " + e.Code
	case containsFold(iq.Types, e.Type):
		m = "error.type " + e.Type
	case slices.Contains(iq.HTTPStatuses, e.HTTPStatus) && !slices.Contains(p.BusinessRejected.Stages, ev.Stage):
		m = fmt.Sprintf("HTTP %d at stage %s, before a business system", e.HTTPStatus, stageName(ev.Stage))
	default:
		return verdict{}, false
	}
	return verdict{
		class: event.ClassInputQuality, route: event.RouteReview, rule: RuleInputQuality,
		reason: fmt.Sprintf("the input is unusable (%s): never retried, to review with the input snapshot", m),
		esc:    iq.Escalation,
	}, true
}

// match reports whether e matches and describes what matched: HTTP status
// first, then code, then type.
func (m *ErrorMatch) match(e *event.Error) (string, bool) {
	switch {
	case e == nil:
		return "", false
	case e.HTTPStatus != 0 && slices.Contains(m.HTTPStatuses, e.HTTPStatus):
		return "HTTP " + itoa(int64(e.HTTPStatus)), true
	case containsFold(m.Codes, e.Code):
		return "error.code " + e.Code, true
	case containsFold(m.Types, e.Type):
		return "error.type " + e.Type, true
	}
	return "", false
}

// --- helpers ---

func containsFold(list []string, s string) bool {
	if s == "" {
		return false
	}
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// describeOutcome names an event's outcome for a reason sentence.
func describeOutcome(ev *event.TaskEvent) string {
	var parts []string
	parts = append(parts, "status "+string(ev.Status))
	if ev.Stage != "" {
		parts = append(parts, "stage "+string(ev.Stage))
	}
	if e := ev.Error; e != nil {
		if e.HTTPStatus != 0 {
			parts = append(parts, "HTTP "+strconv.Itoa(int(e.HTTPStatus)))
		}
		if e.Code != "" {
			parts = append(parts, "code "+e.Code)
		}
		if e.Type != "" {
			parts = append(parts, "type "+e.Type)
		}
	}
	return strings.Join(parts, ", ")
}

func stageName(s event.Stage) string {
	if s == "" {
		return "null"
	}
	return string(s)
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

// itoa is strconv.FormatInt in base 10 (fmt's %d), for reasons built by
// concatenation: fmt.Sprintf costs more than the rest of a decision.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
