package event

// Rules of the audit record of a reviewer's decision (Decision.Rule on a
// record whose input is the decisions topic): the item was approved and the
// task is retried now, the item was rejected and the task has ended, or the
// task had no open item and nothing changed.
const (
	RuleManualOverride = "MANUAL_OVERRIDE_SUCCESS"
	RuleManualRejected = "MANUAL_REJECTED"
	RuleNoOpenItem     = "review.no_open_item"
)

// Decision is what the router decided for one input record. It travels on
// every routed and audit record.
type Decision struct {
	Class  Class  `json:"class"`
	Route  Route  `json:"route"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
	// Retry is the retry plan when Route is RETRY.
	Retry *RetryPlan `json:"retry"`
	// Totals are the task's running totals after this event.
	Totals Totals `json:"totals"`
	// Review is set when Route is REVIEW or QUARANTINE.
	Review *Review `json:"review,omitempty"`
	// Feedback carries the validator's structured feedback to a retry.
	Feedback string `json:"feedback,omitempty"`
	// SuggestedModel is the model the policy suggests for the retry.
	SuggestedModel string `json:"suggested_model,omitempty"`
	// UserMessage is the standard message for the end user of a rejected task.
	UserMessage string `json:"user_message,omitempty"`
	// DecidedAt is when the router decided.
	DecidedAt Timestamp `json:"decided_at"`
	// Prevented is set on the audit record of a decision that stopped a
	// task: the cost a blind retry baseline would still have spent.
	Prevented *Prevented `json:"prevented,omitempty"`
	// Override names the policy override whose match selected the settings
	// this decision was made with; empty when the base policy decided.
	Override string `json:"override,omitempty"`
}

// Prevented is the cost one stop prevented, against a baseline that retries
// every failure BaselineRetries times.
type Prevented struct {
	// Stop is refusal, dead_letter, budget or unknown_write.
	Stop            string `json:"stop"`
	BaselineRetries int32  `json:"baseline_retries"`
	// Attempts are the attempts the baseline would still have made.
	Attempts int32 `json:"attempts"`
	// USD is Attempts x the task's mean attempt cost.
	USD float64 `json:"usd"`
}

// RetryPlan says which retry this is and when it is due.
type RetryPlan struct {
	N         int32     `json:"n"`
	DelayMs   int64     `json:"delay_ms"`
	NotBefore Timestamp `json:"not_before"`
}

// Totals are a task's running totals.
type Totals struct {
	Attempts  int32   `json:"attempts"`
	Retries   int32   `json:"retries"`
	CostUSD   float64 `json:"cost_usd"`
	Tokens    int64   `json:"tokens"`
	ElapsedMs int64   `json:"elapsed_ms"`
}

// Review is the routing information of a human-review item.
type Review struct {
	Owner    string `json:"owner"`
	SLAMs    int64  `json:"sla_ms"`
	Priority string `json:"priority"`
}

// Source locates the input record a routed record came from.
type Source struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Timestamp Timestamp `json:"timestamp"`
}

// Routed is a record the router writes to the retry, review, audit and
// dead-letter topics: the input event (nil when it could not be decoded),
// the decision, and where the input came from.
type Routed struct {
	Event    *TaskEvent `json:"-"`
	Decision Decision   `json:"decision"`
	Input    Source     `json:"input"`
}
