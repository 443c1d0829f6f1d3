package policy

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Validate checks every field and returns the first problem as a *FieldError
// naming the field and what is allowed. It also compiles the refusal-phrase
// library and the overrides: call it again after changing a Policy.
func (p *Policy) Validate() error {
	v := &validator{p: p}
	v.check()
	if v.err != nil {
		return v.err
	}
	p.refusalSet = compilePhrases(p.ModelRefusal.allPhrases())
	ovr, err := p.compileOverrides() // override.go
	if err != nil {
		return err
	}
	p.overrides = ovr
	return nil
}

// validator keeps the first error; later checks are no-ops.
type validator struct {
	p   *Policy
	err error
}

func (v *validator) fail(path, format string, args ...any) {
	if v.err == nil {
		v.err = &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
}

func (v *validator) nonNegative(path string, n int64) {
	if n < 0 {
		v.fail(path, "must be >= 0, got %d", n)
	}
}

func (v *validator) positive(path string, n int64) {
	if n <= 0 {
		v.fail(path, "must be > 0, got %d", n)
	}
}

func (v *validator) check() {
	p := v.p
	v.nonNegative("retry_budget", int64(p.RetryBudget))
	v.positive("default_sla_ms", p.DefaultSLAMs)
	if len(p.Owners) == 0 {
		v.fail("owners", "must name at least one review owner")
	}
	for _, id := range sortedKeys(p.Owners) {
		if strings.TrimSpace(id) == "" {
			v.fail("owners", "an owner ID must not be empty")
		}
		v.positive("owners."+id+".sla_ms", p.Owners[id].SLAMs)
	}

	if b := p.CostPrevented.BaselineRetries; b < 0 || b > MaxBaselineRetries {
		v.fail("cost_prevented.baseline_retries", "must be between 0 and %d, got %d", MaxBaselineRetries, b)
	}

	nt := &p.NetworkTimeout
	v.errorMatch("network_timeout", &nt.ErrorMatch)
	v.nonNegative("network_timeout.max_retries", int64(nt.MaxRetries))
	v.nonNegative("network_timeout.base_delay_ms", nt.BaseDelayMs)
	v.nonNegative("network_timeout.max_delay_ms", nt.MaxDelayMs)
	if nt.MaxDelayMs < nt.BaseDelayMs {
		v.fail("network_timeout.max_delay_ms", "must be >= base_delay_ms (%d), got %d", nt.BaseDelayMs, nt.MaxDelayMs)
	}

	af := &p.AuthFailed
	v.errorMatch("auth_failed", &af.ErrorMatch)
	v.nonNegative("auth_failed.max_retries", int64(af.MaxRetries))
	v.nonNegative("auth_failed.delay_ms", af.DelayMs)
	v.escalation("auth_failed", af.Escalation)

	v.errorMatch("input_quality_issue", &p.InputQuality.ErrorMatch)
	v.escalation("input_quality_issue", p.InputQuality.Escalation)

	mr := &p.ModelRefusal
	if !(mr.MinConfidence >= 0 && mr.MinConfidence <= 1) {
		v.fail("model_refusal.min_confidence", "must be between 0 and 1, got %v", mr.MinConfidence)
	}
	v.phrases("model_refusal.phrases", mr.Phrases)
	v.phrases("model_refusal.extra_phrases", mr.ExtraPhrases)
	if len(mr.Phrases)+len(mr.ExtraPhrases) == 0 {
		v.fail("model_refusal.phrases", "must hold at least one phrase (phrases or extra_phrases)")
	}
	v.escalation("model_refusal", mr.Escalation)

	v.strings("schema_violation.codes", p.SchemaViolation.Codes)
	v.escalation("schema_violation", p.SchemaViolation.Escalation)

	v.validation()

	v.errorMatch("duplicate_execution", &p.DuplicateExecution.ErrorMatch)

	br := &p.BusinessRejected
	v.errorMatch("business_rejected", &br.ErrorMatch)
	for i, s := range br.Stages {
		if !slices.Contains(event.Stages, s) {
			v.fail(fmt.Sprintf("business_rejected.stages[%d]", i), "must be one of %v, got %q", event.Stages, s)
		}
	}
	v.escalation("business_rejected", br.Escalation)

	v.strings("model_hallucination.flags", p.Hallucination.Flags)
	v.escalation("model_hallucination", p.Hallucination.Escalation)

	rl := &p.RateLimited
	v.errorMatch("rate_limited", &rl.ErrorMatch)
	v.nonNegative("rate_limited.default_delay_ms", rl.DefaultDelayMs)
	v.nonNegative("rate_limited.window_ms", rl.WindowMs)
	v.positive("rate_limited.max_retry_after_ms", rl.MaxRetryAfterMs)
	for _, d := range []struct {
		field string
		ms    int64
	}{
		{"rate_limited.max_retry_after_ms", rl.MaxRetryAfterMs},
		{"rate_limited.default_delay_ms", rl.DefaultDelayMs},
		{"network_timeout.max_delay_ms", p.NetworkTimeout.MaxDelayMs},
	} {
		if d.ms > MaxRetryDelayMs {
			v.fail(d.field, "must be <= %d (%s), got %d", MaxRetryDelayMs, time.Duration(MaxRetryDelayMs)*time.Millisecond, d.ms)
		}
	}

	b := &p.Budget
	if !(b.MaxCostUSD > 0) {
		v.fail("budget_exhausted.max_cost_usd", "must be > 0, got %v", b.MaxCostUSD)
	}
	v.positive("budget_exhausted.max_tokens", b.MaxTokens)
	v.positive("budget_exhausted.max_elapsed_ms", b.MaxElapsedMs)
	v.escalation("budget_exhausted", b.Escalation)

	v.escalation("outcome_unknown", p.OutcomeUnknown)
	v.escalation("params_mismatch", p.ParamsMismatch)
	v.escalation("unclassified", p.Unclassified)

	v.breaker("breakers.provider_model", p.Breakers.ProviderModel)
	v.breaker("breakers.downstream", p.Breakers.Downstream)
	v.breaker("breakers.prompt_template", p.Breakers.PromptTemplate)
	v.surge(&p.Surge)

	if len(p.ReviewLoop.UserMessages) == 0 {
		v.fail("review_loop.user_messages", "must hold at least one message")
	}
	for i, m := range p.ReviewLoop.UserMessages {
		if !strings.Contains(m, "{reason}") {
			v.fail(fmt.Sprintf("review_loop.user_messages[%d]", i), "must contain the placeholder {reason}, got %q", m)
		}
	}
}

func (v *validator) breaker(path string, b Breaker) {
	v.positive(path+".window_ms", b.WindowMs)
	v.positive(path+".min_requests", int64(b.MinRequests))
	if !(b.FailureRatio > 0 && b.FailureRatio <= 1) {
		v.fail(path+".failure_ratio", "must be > 0 and <= 1, got %v", b.FailureRatio)
	}
	v.positive(path+".cooldown_ms", b.CooldownMs)
	v.positive(path+".half_open_probes", int64(b.HalfOpenProbes))
}

func (v *validator) surge(s *Surge) {
	v.positive("surge.window_ms", s.WindowMs)
	v.positive("surge.min_events", int64(s.MinEvents))
	if !(s.Ratio > 0 && s.Ratio <= 1) {
		v.fail("surge.ratio", "must be > 0 and <= 1, got %v", s.Ratio)
	}
	// a surge of successes is no alert
	classes := slices.DeleteFunc(slices.Clone(event.Classes), func(c event.Class) bool { return c == event.ClassSucceeded })
	for i, c := range s.Classes {
		path := fmt.Sprintf("surge.classes[%d]", i)
		switch {
		case !slices.Contains(classes, c):
			v.fail(path, "must be one of %v, got %q", classes, c)
		case slices.Contains(s.Classes[:i], c):
			v.fail(path, "%s is listed twice", c)
		}
	}
	for i, sc := range s.Scopes {
		path := fmt.Sprintf("surge.scopes[%d]", i)
		switch {
		case !slices.Contains(surgeScopes, sc):
			v.fail(path, "must be one of %v, got %q", surgeScopes, sc)
		case slices.Contains(s.Scopes[:i], sc):
			v.fail(path, "%s is listed twice", sc)
		}
	}
}

func (v *validator) validation() {
	vf := &v.p.ValidationFixable
	if strings.TrimSpace(vf.CodePrefix) == "" {
		v.fail("validation_fixable.code_prefix", "must not be empty, e.g. CODE_")
	}
	v.nonNegative("validation_fixable.max_retries", int64(vf.MaxRetries))
	v.nonNegative("validation_fixable.delay_ms", vf.DelayMs)
	for i, r := range vf.Ranges {
		path := fmt.Sprintf("validation_fixable.ranges[%d]", i)
		switch {
		case r.From < 0:
			v.fail(path+".from", "must be >= 0, got %d", r.From)
		case r.To < r.From:
			v.fail(path+".to", "must be >= from (%d), got %d", r.From, r.To)
		case r.Route != event.RouteRetry && r.Route != event.RouteReview:
			v.fail(path+".route", "must be RETRY or REVIEW, got %q", r.Route)
		case r.Route == event.RouteReview && r.SuggestedModel != "":
			v.fail(path+".suggested_model", "must be empty when route is REVIEW (nothing is retried), got %q", r.SuggestedModel)
		}
		for j, o := range vf.Ranges[:i] {
			if r.From <= o.To && o.From <= r.To {
				v.fail(path, "range %d-%d overlaps ranges[%d] (%d-%d); ranges must be disjoint", r.From, r.To, j, o.From, o.To)
			}
		}
	}
	v.escalation("validation_fixable", vf.Escalation)
}

func (v *validator) errorMatch(path string, m *ErrorMatch) {
	v.strings(path+".error_types", m.Types)
	v.strings(path+".codes", m.Codes)
	for i, s := range m.HTTPStatuses {
		if s < 100 || s > 599 {
			v.fail(fmt.Sprintf("%s.http_statuses[%d]", path, i), "must be an HTTP status 100-599, got %d", s)
		}
	}
}

func (v *validator) strings(path string, list []string) {
	for i, s := range list {
		if strings.TrimSpace(s) == "" {
			v.fail(fmt.Sprintf("%s[%d]", path, i), "must not be empty")
		}
	}
}

func (v *validator) phrases(path string, list []string) {
	for i, s := range list {
		if _, compact := normalise(s); compact == "" {
			v.fail(fmt.Sprintf("%s[%d]", path, i), "must contain a letter or digit (punctuation and spacing are ignored when matching), got %q", s)
		}
	}
}

func (v *validator) escalation(path string, e Escalation) {
	if _, ok := v.p.Owners[e.Owner]; !ok {
		v.fail(path+".owner", "must be one of the owners %v, got %q", sortedKeys(v.p.Owners), e.Owner)
	}
	if !slices.Contains(priorities, e.Priority) {
		v.fail(path+".priority", "must be one of %v, got %q", priorities, e.Priority)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
