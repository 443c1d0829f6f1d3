// Package workload is the mix of worker reports that make bench routes and
// the Go benchmarks measure: tasks of three attempts, each task of one shape
// picked by weight, mostly transient network failures that a retry fixes
// (a few outlast the retries), then rate limits, fixable validation errors,
// refusals, credentials, business rejections, writes whose receipt was lost
// and exact redeliveries. The same seed, task and attempt give the same event.
package workload

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// A task of the workload is three attempts of one shape. The shapes and their
// weights are a realistic mix of what workers report: mostly transient
// network failures that a retry fixes (and a few outages that outlast the
// retries), then rate limits, fixable validation
// errors, refusals, credentials, business rejections, writes whose receipt
// was lost and exact redeliveries.
type shape struct {
	name   string
	weight int
	// attempt returns attempt n (1..3) of the task; dup is true when the
	// attempt is an exact redelivery of the previous one (same event_id).
	attempt func(e *event.TaskEvent, n int) (dup bool)
}

var shapes = []shape{
	{"timeout, timeout, ok", 36, func(e *event.TaskEvent, n int) bool {
		if n < 3 {
			timeout(e)
		}
		return false
	}},
	{"timeout, timeout, timeout (an outage outlasting the retries)", 4, func(e *event.TaskEvent, n int) bool {
		timeout(e)
		return false
	}},
	{"rate limited, ok, redelivered ok", 12, func(e *event.TaskEvent, n int) bool {
		switch n {
		case 1:
			ms := int64(500)
			e.Stage, e.Status = event.StageProtocol, event.StatusError
			e.Error = &event.Error{Type: "RateLimitError", HTTPStatus: 429, Message: "Rate limit reached for requests", RetryAfterMs: &ms}
		case 3:
			return true
		}
		return false
	}},
	{"validation CODE_1xxx, CODE_2xxx, ok", 12, func(e *event.TaskEvent, n int) bool {
		codes := []string{"CODE_1003", "CODE_2101"}
		if n < 3 {
			e.Stage, e.Status = event.StageBusiness, event.StatusError
			e.Error = &event.Error{Type: "ValidationError", Code: codes[n-1], Message: "field total does not match the sum of the line items"}
		}
		return false
	}},
	{"refusal, then two late attempts", 10, func(e *event.TaskEvent, n int) bool {
		if n == 1 {
			v := true
			e.Stage, e.Status = event.StageModel, event.StatusError
			e.Output = &event.Output{Text: "I'm sorry, but I can't help with that request.", SchemaValid: &v}
		}
		return false
	}},
	{"auth 401, auth 401, ok", 8, func(e *event.TaskEvent, n int) bool {
		if n < 3 {
			e.Stage, e.Status = event.StageProtocol, event.StatusError
			e.Error = &event.Error{Type: "AuthenticationError", HTTPStatus: 401, Code: "token_expired"}
		}
		return false
	}},
	{"business rejected, then two late attempts", 8, func(e *event.TaskEvent, n int) bool {
		if n == 1 {
			e.Stage, e.Status = event.StageBusiness, event.StatusError
			e.Error = &event.Error{Type: "BusinessError", HTTPStatus: 422, Code: "insufficient_balance", Message: "account balance too low"}
		}
		return false
	}},
	{"write submitted without receipt, then confirmed", 5, func(e *event.TaskEvent, n int) bool {
		st := event.OpSubmitted
		if n > 1 {
			st = event.OpConfirmed
		}
		e.Operation = &event.Operation{OpID: "op-" + e.TaskID, Kind: event.OpWrite, ParamsSHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", State: st}
		if n == 1 {
			e.Stage, e.Status = event.StageNetwork, event.StatusError
			e.Error = &event.Error{Type: "TimeoutError", HTTPStatus: 504}
		}
		return false
	}},
	{"ok, ok, ok", 5, func(e *event.TaskEvent, n int) bool { return false }},
}

func timeout(e *event.TaskEvent) {
	e.Stage, e.Status = event.StageNetwork, event.StatusError
	e.Error = &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream request timed out after 30000 ms"}
}

var (
	providers = []string{"openai", "anthropic", "google", "mistral"}
	models    = []string{"gpt-4o", "claude-sonnet", "gemini-pro", "mistral-large", "gpt-4o-mini", "claude-haiku"}
	actions   = []string{"answer_ticket", "refund", "contract_review", "summarize", "extract_invoice"}
)

// Event builds attempt n (1..3) of task i, with task IDs prefix-NNNNNNNN; the
// shape of the task decides whether it is a redelivery of attempt n-1 (same
// event_id).
func Event(prefix string, seed uint64, i, n int, at time.Time) event.TaskEvent {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	pick := rng.IntN(100)
	var sh shape
	for _, s := range shapes {
		if pick < s.weight {
			sh = s
			break
		}
		pick -= s.weight
	}
	id := fmt.Sprintf("%s-%08d", prefix, i)
	sla := int64(6 * 3600 * 1000)
	e := event.TaskEvent{
		EventID: fmt.Sprintf("%s-a%d", id, n), TaskID: id, Attempt: int32(n),
		OccurredAt: event.At(at), Source: "support-bot", Action: actions[rng.IntN(len(actions))],
		Provider: providers[rng.IntN(len(providers))], Model: models[rng.IntN(len(models))],
		PromptTemplate: fmt.Sprintf("tmpl-%02d-v3", rng.IntN(40)),
		Status:         event.StatusOK,
		Output:         nil,
		Usage:          event.Usage{CostUSD: 0.0004 + float64(rng.IntN(40))/10000, Tokens: int64(200 + rng.IntN(600)), ElapsedMs: int64(300 + rng.IntN(4000))},
		InputRef:       &event.InputRef{URI: "s3://tickets/" + id + ".json", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", SizeBytes: int64(1000 + rng.IntN(50000))},
		SLAMs:          &sla,
		Attributes:     map[string]string{"tenant": fmt.Sprintf("tenant-%d", rng.IntN(20)), "region": "eu-west-1"},
	}
	if sh.attempt(&e, n) {
		e.EventID = fmt.Sprintf("%s-a%d", id, n-1)
		e.Attempt = int32(n - 1)
	}
	return e
}
