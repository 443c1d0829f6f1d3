package policy

import "github.com/faultrouter/faultrouter/pkg/event"

// Policy is the whole policy file. Every field has a default (Default); a
// policy file overrides any subset of them. Durations are integer
// milliseconds (keys ending in _ms), like the event fields.
type Policy struct {
	// RetryBudget caps the retries of one task across all classes, on top of
	// each class's own limit. Default 4. 0 disables automatic retries.
	RetryBudget int32 `yaml:"retry_budget"`
	// DefaultSLAMs is the task SLA when an event carries no sla_ms; task state
	// lives 2 x SLA after the task's last event. Default 24 h.
	DefaultSLAMs int64 `yaml:"default_sla_ms"`
	// Owners are the review owners and their response SLA, by owner ID. The
	// owner fields of the class sections name one of these.
	Owners map[string]Owner `yaml:"owners"`

	NetworkTimeout     NetworkTimeout     `yaml:"network_timeout"`
	AuthFailed         AuthFailed         `yaml:"auth_failed"`
	InputQuality       InputQuality       `yaml:"input_quality_issue"`
	ModelRefusal       ModelRefusal       `yaml:"model_refusal"`
	SchemaViolation    SchemaViolation    `yaml:"schema_violation"`
	ValidationFixable  ValidationFixable  `yaml:"validation_fixable"`
	DuplicateExecution DuplicateExecution `yaml:"duplicate_execution"`
	BusinessRejected   BusinessRejected   `yaml:"business_rejected"`
	Hallucination      Hallucination      `yaml:"model_hallucination"`
	RateLimited        RateLimited        `yaml:"rate_limited"`
	Budget             Budget             `yaml:"budget_exhausted"`
	// OutcomeUnknown routes a WRITE operation SUBMITTED or UNKNOWN to review.
	OutcomeUnknown Escalation `yaml:"outcome_unknown"`
	// ParamsMismatch routes an operation whose parameters changed to review.
	ParamsMismatch Escalation `yaml:"params_mismatch"`
	// Unclassified routes an error no rule matches to review.
	Unclassified Escalation `yaml:"unclassified"`
	ReviewLoop   ReviewLoop `yaml:"review_loop"`
	// Breakers are the circuit breakers' windows and thresholds per scope.
	Breakers Breakers `yaml:"breakers"`
	// Surge alerts when one class rises for one prompt template or model.
	Surge Surge `yaml:"surge"`
	// CostPrevented states the blind baseline that cost prevented is
	// measured against (prevented.go).
	CostPrevented CostPrevented `yaml:"cost_prevented"`
	// Overrides change class sections for the events they match by
	// provider, model, action and prompt template; the most specific match
	// wins (override.go). None by default.
	Overrides []Override `yaml:"overrides"`

	// refusalSet is the compiled phrase list (see Validate).
	refusalSet *phraseSet
	// overrides are Overrides compiled by Validate, most specific first;
	// nil when there are none.
	overrides []compiledOverride
}

// Owner is a review owner.
type Owner struct {
	// SLAMs is the owner's response SLA; an open item older than this alerts.
	SLAMs int64 `yaml:"sla_ms"`
}

// Escalation says who reviews a class and how urgently.
type Escalation struct {
	// Owner is a key of Policy.Owners.
	Owner string `yaml:"owner"`
	// Priority is high, normal or low.
	Priority string `yaml:"priority"`
}

// Priorities of a review item.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
	PriorityLow    = "low"
)

var priorities = []string{PriorityHigh, PriorityNormal, PriorityLow}

// ErrorMatch lists what in an event's error selects a class. Types and codes
// compare case-insensitively with error.type and error.code.
type ErrorMatch struct {
	Types        []string `yaml:"error_types"`
	HTTPStatuses []int32  `yaml:"http_statuses"`
	Codes        []string `yaml:"codes"`
}

// NetworkTimeout is a transient network failure: retried with exponential
// backoff, min(BaseDelayMs x 2^(n-1), MaxDelayMs) before retry n, then
// dead-lettered.
type NetworkTimeout struct {
	ErrorMatch  `yaml:",inline"`
	MaxRetries  int32 `yaml:"max_retries"`
	BaseDelayMs int64 `yaml:"base_delay_ms"`
	MaxDelayMs  int64 `yaml:"max_delay_ms"`
}

// AuthFailed is a credentials failure: MaxRetries retries with refreshed
// credentials and the same task ID, after DelayMs; the next failure goes to
// review.
type AuthFailed struct {
	ErrorMatch `yaml:",inline"`
	MaxRetries int32 `yaml:"max_retries"`
	DelayMs    int64 `yaml:"delay_ms"`
	Escalation `yaml:",inline"`
}

// InputQuality is a bad input: never retried, reviewed with the input
// snapshot. Its HTTP statuses count at every stage except those of
// business_rejected.stages (a 400 before the model ran); its codes count at
// every stage.
type InputQuality struct {
	ErrorMatch `yaml:",inline"`
	Escalation `yaml:",inline"`
}

// ModelRefusal is a model that declined or was unsure: terminal, to review.
type ModelRefusal struct {
	// MinConfidence: output.confidence below it is a refusal (0.7499 is,
	// 0.75 is not).
	MinConfidence float64 `yaml:"min_confidence"`
	// Phrases is the refusal-phrase library. Setting it replaces the built-in
	// list; ExtraPhrases adds to it.
	Phrases      []string `yaml:"phrases"`
	ExtraPhrases []string `yaml:"extra_phrases"`
	Escalation   `yaml:",inline"`
}

// SchemaViolation is output that breaks its schema (output.schema_valid
// false, or one of Codes): terminal, to review.
type SchemaViolation struct {
	Codes      []string `yaml:"codes"`
	Escalation `yaml:",inline"`
}

// ValidationFixable is a structured validator code CodePrefix + digits, e.g.
// CODE_2101. The range holding the number decides: RETRY ranges retry with the
// validator's feedback and the range's suggested model, at most MaxRetries
// times; REVIEW ranges, and a RETRY range out of retries, go to review.
type ValidationFixable struct {
	CodePrefix string      `yaml:"code_prefix"`
	MaxRetries int32       `yaml:"max_retries"`
	DelayMs    int64       `yaml:"delay_ms"`
	Ranges     []CodeRange `yaml:"ranges"`
	Escalation `yaml:",inline"`
}

// CodeRange is a range of validator code numbers, From to To inclusive.
type CodeRange struct {
	Name           string      `yaml:"name"`
	From           int         `yaml:"from"`
	To             int         `yaml:"to"`
	Route          event.Route `yaml:"route"`
	SuggestedModel string      `yaml:"suggested_model"`
}

// DuplicateExecution is a downstream that says the work was already done:
// the task ends, audit only.
type DuplicateExecution struct {
	ErrorMatch `yaml:",inline"`
}

// BusinessRejected is a downstream business system saying no: never retried,
// to review. Codes count at every stage; HTTP statuses only at Stages.
type BusinessRejected struct {
	ErrorMatch `yaml:",inline"`
	Stages     []event.Stage `yaml:"stages"`
	Escalation `yaml:",inline"`
}

// Hallucination is output flagged as fabricated or unsafe: quarantined.
type Hallucination struct {
	// Flags are the output.flags values that quarantine, compared
	// case-insensitively.
	Flags      []string `yaml:"flags"`
	Escalation `yaml:",inline"`
}

// MaxRetryDelayMs bounds every retry delay a policy may configure (30 days):
// rate_limited.max_retry_after_ms, rate_limited.default_delay_ms and
// network_timeout.max_delay_ms. A pending retry keeps its task's state, so
// the longest delay is also the longest a task can wait for its retry.
const MaxRetryDelayMs = 30 * 24 * hour

// RateLimited is a 429: retried after error.retry_after_ms, else
// DefaultDelayMs; a second one within WindowMs (inclusive, on occurred_at)
// is RATE_LIMIT_EXCEEDED and dead-lettered. A retry_after_ms above
// MaxRetryAfterMs is capped at it: the router holds a pending retry (and the
// task's state) no longer than that, whatever the provider asks.
type RateLimited struct {
	ErrorMatch      `yaml:",inline"`
	DefaultDelayMs  int64 `yaml:"default_delay_ms"`
	WindowMs        int64 `yaml:"window_ms"`
	MaxRetryAfterMs int64 `yaml:"max_retry_after_ms"`
}

// Budget caps a task's usage. A limit is reached when the task's total is
// greater than or equal to it: at exactly $0.50 nothing is left.
type Budget struct {
	MaxCostUSD   float64 `yaml:"max_cost_usd"`
	MaxTokens    int64   `yaml:"max_tokens"`
	MaxElapsedMs int64   `yaml:"max_elapsed_ms"`
	Escalation   `yaml:",inline"`
}

// ReviewLoop configures the reviewer's decisions.
type ReviewLoop struct {
	// UserMessages are the end-user messages of a rejected task, one per
	// language; "{reason}" is replaced by the reviewer's reason.
	UserMessages []string `yaml:"user_messages"`
}

// Breakers configures the circuit breakers of each scope (pkg/breaker).
type Breakers struct {
	// ProviderModel breakers count failures per provider/model.
	ProviderModel Breaker `yaml:"provider_model"`
	// Downstream breakers count failures per downstream system: the event's
	// action (refund, contract_review).
	Downstream Breaker `yaml:"downstream"`
	// PromptTemplate breakers count output failures per prompt template.
	PromptTemplate Breaker `yaml:"prompt_template"`
}

// Breaker is one scope's rolling window and thresholds.
type Breaker struct {
	// WindowMs is the rolling window failures are counted in.
	WindowMs int64 `yaml:"window_ms"`
	// MinRequests is the fewest outcomes in the window before it may open.
	MinRequests int32 `yaml:"min_requests"`
	// FailureRatio opens the breaker when failures/requests >= it; in (0, 1].
	FailureRatio float64 `yaml:"failure_ratio"`
	// CooldownMs is how long it stays open before half-open.
	CooldownMs int64 `yaml:"cooldown_ms"`
	// HalfOpenProbes is how many held retries half-open releases as probes,
	// and how many successes close it.
	HalfOpenProbes int32 `yaml:"half_open_probes"`
}

// Surge configures surge alerts: one class rising for one prompt template or
// provider/model (MODEL_REFUSAL after a prompt change) raises one alert
// naming the key. It fires when, within WindowMs, the class has at least
// MinEvents events of the key and they are at least Ratio of all the key's
// events; it fires again only after that ratio fell below Ratio (or the
// window emptied).
type Surge struct {
	// WindowMs is the rolling window events are counted in.
	WindowMs int64 `yaml:"window_ms"`
	// MinEvents is the fewest events of the class in the window to alert.
	MinEvents int32 `yaml:"min_events"`
	// Ratio alerts when class events / all events of the key >= it; in (0, 1].
	Ratio float64 `yaml:"ratio"`
	// Classes are the watched failure classes; an empty list turns surge
	// alerts off.
	Classes []event.Class `yaml:"classes"`
	// Scopes are the keys watched: PROMPT_TEMPLATE, PROVIDER_MODEL.
	Scopes []event.BreakerScope `yaml:"scopes"`
}

// Surge scopes.
const (
	SurgeScopePromptTemplate = event.ScopePromptTemplate
	SurgeScopeProviderModel  = event.ScopeProviderModel
)

var surgeScopes = []event.BreakerScope{SurgeScopePromptTemplate, SurgeScopeProviderModel}

// Owner IDs of the default policy.
const (
	OwnerSecurity          = "security"
	OwnerProductOperations = "product_operations"
	OwnerAIProduct         = "ai_product"
	OwnerOperations        = "operations"
	OwnerContentSafety     = "content_safety"
)

const (
	minute = int64(60_000)
	hour   = 60 * minute
)

// Default returns the default policy of docs/design.md. Each call returns a new
// value the caller may change (then call Validate).
func Default() *Policy {
	p := &Policy{
		RetryBudget:  4,
		DefaultSLAMs: 24 * hour,
		Owners: map[string]Owner{
			OwnerSecurity:          {SLAMs: 1 * hour},
			OwnerProductOperations: {SLAMs: 15 * minute},
			OwnerAIProduct:         {SLAMs: 72 * hour},
			OwnerOperations:        {SLAMs: 30 * minute},
			OwnerContentSafety:     {SLAMs: 1 * minute},
		},
		NetworkTimeout: NetworkTimeout{
			ErrorMatch: ErrorMatch{
				Types:        []string{"ConnectionResetError", "TimeoutError", "ConnectTimeout", "ReadTimeout"},
				HTTPStatuses: []int32{502, 503, 504},
				Codes:        []string{"timeout", "connection_reset", "ETIMEDOUT", "ECONNRESET"},
			},
			MaxRetries:  2,
			BaseDelayMs: 1000,
			MaxDelayMs:  5000,
		},
		AuthFailed: AuthFailed{
			ErrorMatch: ErrorMatch{
				Types:        []string{"AuthenticationError", "PermissionDeniedError"},
				HTTPStatuses: []int32{401, 403},
				Codes:        []string{"invalid_token", "token_expired"},
			},
			MaxRetries: 1,
			DelayMs:    0,
			Escalation: Escalation{Owner: OwnerSecurity, Priority: PriorityHigh},
		},
		InputQuality: InputQuality{
			ErrorMatch: ErrorMatch{
				HTTPStatuses: []int32{400},
				Codes:        []string{"invalid_file_format", "file_too_large", "text_too_short"},
			},
			Escalation: Escalation{Owner: OwnerProductOperations, Priority: PriorityNormal},
		},
		ModelRefusal: ModelRefusal{
			MinConfidence: 0.75,
			Phrases:       DefaultRefusalPhrases(),
			Escalation:    Escalation{Owner: OwnerAIProduct, Priority: PriorityNormal},
		},
		SchemaViolation: SchemaViolation{
			Codes:      []string{"schema_violation", "required_field_missing", "missing_required_field"},
			Escalation: Escalation{Owner: OwnerAIProduct, Priority: PriorityNormal},
		},
		ValidationFixable: ValidationFixable{
			CodePrefix: "CODE_",
			MaxRetries: 3,
			DelayMs:    0,
			Ranges: []CodeRange{
				{Name: "format", From: 1000, To: 1999, Route: event.RouteRetry, SuggestedModel: "qwen"},
				{Name: "logic", From: 2000, To: 2999, Route: event.RouteRetry, SuggestedModel: "claude"},
				{Name: "ambiguous", From: 3000, To: 3999, Route: event.RouteReview},
			},
			Escalation: Escalation{Owner: OwnerAIProduct, Priority: PriorityNormal},
		},
		DuplicateExecution: DuplicateExecution{
			ErrorMatch: ErrorMatch{
				HTTPStatuses: []int32{409},
				Codes:        []string{"duplicate_task_id", "already_processed"},
			},
		},
		BusinessRejected: BusinessRejected{
			ErrorMatch: ErrorMatch{
				HTTPStatuses: []int32{400, 422},
				Codes:        []string{"insufficient_balance", "account_closed"},
			},
			Stages:     []event.Stage{event.StageBusiness},
			Escalation: Escalation{Owner: OwnerOperations, Priority: PriorityNormal},
		},
		Hallucination: Hallucination{
			Flags:      []string{"fabricated_data", "compliance_violation", "prohibited_content"},
			Escalation: Escalation{Owner: OwnerContentSafety, Priority: PriorityHigh},
		},
		RateLimited: RateLimited{
			ErrorMatch: ErrorMatch{
				Types:        []string{"RateLimitError"},
				HTTPStatuses: []int32{429},
				Codes:        []string{"rate_limited", "rate_limit_exceeded"},
			},
			DefaultDelayMs:  10_000,
			MaxRetryAfterMs: hour,
			WindowMs:        60_000,
		},
		Budget: Budget{
			MaxCostUSD:   0.50,
			MaxTokens:    3000,
			MaxElapsedMs: 30_000,
			Escalation:   Escalation{Owner: OwnerOperations, Priority: PriorityHigh},
		},
		OutcomeUnknown: Escalation{Owner: OwnerOperations, Priority: PriorityHigh},
		ParamsMismatch: Escalation{Owner: OwnerOperations, Priority: PriorityHigh},
		Unclassified:   Escalation{Owner: OwnerOperations, Priority: PriorityNormal},
		Breakers: Breakers{
			ProviderModel:  Breaker{WindowMs: minute, MinRequests: 20, FailureRatio: 0.5, CooldownMs: 30_000, HalfOpenProbes: 1},
			Downstream:     Breaker{WindowMs: minute, MinRequests: 20, FailureRatio: 0.5, CooldownMs: 30_000, HalfOpenProbes: 1},
			PromptTemplate: Breaker{WindowMs: 5 * minute, MinRequests: 20, FailureRatio: 0.3, CooldownMs: minute, HalfOpenProbes: 1},
		},
		Surge: Surge{
			WindowMs:  5 * minute,
			MinEvents: 10,
			Ratio:     0.3,
			Classes: []event.Class{event.ClassModelRefusal, event.ClassSchemaViolation, event.ClassHallucination,
				event.ClassValidationFixable, event.ClassRateLimited},
			Scopes: []event.BreakerScope{SurgeScopePromptTemplate, SurgeScopeProviderModel},
		},
		CostPrevented: CostPrevented{BaselineRetries: 3},
		ReviewLoop: ReviewLoop{
			UserMessages: []string{
				"Your submission has a problem: {reason}. Please correct it and submit again.",
				"您的材料存在{reason}问题，请修正后重新提交",
			},
		},
	}
	p.refusalSet = compilePhrases(p.ModelRefusal.allPhrases())
	return p
}

// allPhrases is the effective refusal-phrase library.
func (m *ModelRefusal) allPhrases() []string {
	out := make([]string, 0, len(m.Phrases)+len(m.ExtraPhrases))
	out = append(out, m.Phrases...)
	return append(out, m.ExtraPhrases...)
}
