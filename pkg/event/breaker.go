package event

// BreakerEvent is a record on the alert topic: a breaker transition or an
// immediate alert (hallucination, budget exhausted, surge, overdue review).
type BreakerEvent struct {
	// Scope is PROVIDER_MODEL, DOWNSTREAM, PROMPT_TEMPLATE or TASK.
	Scope BreakerScope `json:"scope"`
	// Key is the breaker's key within its scope, e.g. "openai/gpt-4o".
	Key string `json:"key"`
	// Kind is TRANSITION or ALERT on the alerts topic, RESET or LATCH on the
	// decisions topic.
	Kind string `json:"kind"`
	// From and To are breaker states (CLOSED, OPEN, HALF_OPEN); empty for alerts.
	From   BreakerStateName `json:"from,omitempty"`
	To     BreakerStateName `json:"to,omitempty"`
	Reason string           `json:"reason"`
	// Class is the failure class behind the event, when there is one.
	Class Class `json:"class,omitempty"`
	// Failures and Requests are the rolling window's counts.
	Failures int32 `json:"failures"`
	Requests int32 `json:"requests"`
	// TaskID is the task that triggered the event.
	TaskID string `json:"task_id,omitempty"`
	// Instance is the router instance that wrote the event.
	Instance string    `json:"instance"`
	At       Timestamp `json:"at"`
}

// BreakerEvent kinds. TRANSITION and ALERT are written by the router to the
// alerts topic. RESET and LATCH are commands on the decisions topic, written
// to every partition so that every router instance applies them: RESET
// closes a breaker (`faultrouter breaker reset`, or a person deciding a
// hallucination's review item), LATCH opens a breaker until a person resets
// it (the instance that saw a hallucination latching its prompt template).
const (
	BreakerKindTransition = "TRANSITION"
	BreakerKindAlert      = "ALERT"
	BreakerKindReset      = "RESET"
	BreakerKindLatch      = "LATCH"
)

// ReviewDecision is what a reviewer decided for a task on the review topic.
type ReviewDecision struct {
	TaskID   string    `json:"task_id"`
	Approve  bool      `json:"approve"`
	Reason   string    `json:"reason"`
	Reviewer string    `json:"reviewer,omitempty"`
	At       Timestamp `json:"at"`
}

// Validate checks the fields a ReviewDecision must have.
func (d *ReviewDecision) Validate() error {
	switch {
	case d.TaskID == "":
		return &FieldError{Field: "task_id", Msg: "required, a non-empty string"}
	case d.Reason == "":
		return &FieldError{Field: "reason", Msg: "required, a non-empty string"}
	case d.At.IsZero():
		return &FieldError{Field: "at", Msg: "required, an RFC 3339 time or integer milliseconds"}
	}
	return nil
}

// ParseReviewDecisionJSON decodes one ReviewDecision strictly.
func ParseReviewDecisionJSON(b []byte) (ReviewDecision, error) {
	var d ReviewDecision
	if err := strictUnmarshal(b, &d); err != nil {
		return d, err
	}
	return d, d.Validate()
}
