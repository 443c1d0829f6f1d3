package workload

import (
	"fmt"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Advice is a stream whose truth is known, for the policy advisor (`faultrouter
// policy advise`): the task events to produce, each task's attempts in
// order, and the reviewers' decisions to produce once every event was
// decided (a decision needs its item open). Time is compressed by setting
// the clocks, not by waiting: each decision's at is its item's opening
// attempt's occurred_at plus the reviewer's wait, so a reviewer who takes
// two hours takes no time at all.
type Advice struct {
	Events    []event.TaskEvent
	Decisions []event.ReviewDecision
}

// The truth AdviceStream(..., true) holds. Without the patterns the same
// tasks come with the truth turned the other way: StuckProvider's second
// retries succeed 40% of the time, reviewers approve 40% of TrustedModel's
// low-confidence refusals, SlowOwner answers in about 15 minutes.
const (
	// StuckProvider's timeouts never clear after the first retry: retry 1
	// succeeds half the time, retry 2 never (its tasks are dead-lettered).
	// It answers with two models.
	StuckProvider = "acme"
	// TrustedProvider/TrustedModel's outputs come with a confidence between
	// 0.65 and 0.75 (under the default min_confidence of 0.75: refusals) and
	// reviewers approve 90% of them.
	TrustedProvider = "nova"
	TrustedModel    = "nova-1"
	// SlowOwner (the default owner of business rejections, SLA 30 min)
	// answers in 2 h: SlowWait ± 10 min.
	SlowOwner = "operations"
	SlowWait  = 2 * time.Hour
	// TrustedApproval is the share of TrustedModel's refusals reviewers
	// approve, and TrustedFrom the confidence its outputs start at.
	TrustedApproval = 0.9
	TrustedFrom     = 0.65
)

// AdviceStream builds the advisor's stream with task IDs prefix-KIND-NNN,
// the first attempt of the first task at base; patterns puts the three
// truths above in it. Beside them it holds what every stream holds and no
// advisor should act on: timeouts of two other providers that clear on the
// first retry 70% of the time and on the second 40%, refusals of another
// model at confidence 0.30-0.55 that reviewers mostly reject within 30
// minutes, and plain successes.
func AdviceStream(prefix string, base time.Time, patterns bool) Advice {
	var a Advice
	at := base
	task := func(kind string, i int) string { return fmt.Sprintf("%s-%s-%03d", prefix, kind, i) }
	attempt := func(id string, n int, pm [2]string, action, tmpl string, t time.Time) event.TaskEvent {
		return event.TaskEvent{
			EventID: fmt.Sprintf("%s-a%d", id, n), TaskID: id, Attempt: int32(n), OccurredAt: event.At(t),
			Source: "advice-worker", Action: action, Provider: pm[0], Model: pm[1], PromptTemplate: tmpl,
			Status: event.StatusOK, Usage: event.Usage{CostUSD: 0.002 + float64(n)/1000, Tokens: 400, ElapsedMs: 1500},
		}
	}
	timeout := func(e event.TaskEvent) event.TaskEvent {
		e.Stage, e.Status = event.StageNetwork, event.StatusError
		e.Error = &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream request timed out"}
		return e
	}
	ok := func(e event.TaskEvent, conf float64) event.TaskEvent {
		v := true
		e.Stage = event.StageModel
		e.Output = &event.Output{Text: "Refund of order 1042 approved: the receipt matches the charge.", SchemaValid: &v, Confidence: &conf}
		return e
	}
	decide := func(id string, opened time.Time, wait time.Duration, approve bool) {
		a.Decisions = append(a.Decisions, event.ReviewDecision{TaskID: id, Approve: approve, Reason: "checked against the order",
			Reviewer: "advice-reviewer", At: event.At(opened.Add(wait))})
	}
	// a task of timeouts: attempt n+1 comes 3 s after attempt n; succeeds
	// says whether attempt n (2 or 3) succeeds
	timeouts := func(id string, pm [2]string, action, tmpl string, succeeds func(n int) bool) {
		t := at
		a.Events = append(a.Events, timeout(attempt(id, 1, pm, action, tmpl, t)))
		for n := 2; n <= 3; n++ {
			t = t.Add(3 * time.Second)
			if succeeds(n) {
				a.Events = append(a.Events, ok(attempt(id, n, pm, action, tmpl, t), 0.9))
				return
			}
			a.Events = append(a.Events, timeout(attempt(id, n, pm, action, tmpl, t)))
		}
	}
	actions, tmpls := []string{"refund", "answer_ticket"}, []string{"refund-v2", "support-v7"}

	for i := range 80 { // the stuck provider, two models
		pm := [2]string{StuckProvider, []string{"acme-large", "acme-small"}[i%2]}
		timeouts(task("acme", i), pm, actions[i/2%2], tmpls[i/4%2], func(n int) bool {
			if n == 2 {
				return i/2%2 == 0 // half of them on the first retry
			}
			return !patterns && i/4%5 < 2 // none on the second: 40% without the pattern
		})
		at = at.Add(time.Second)
	}
	for i := range 60 { // timeouts that clear
		pm := [][2]string{{"openai", "gpt-4o"}, {"anthropic", "claude-sonnet"}}[i%2]
		timeouts(task("net", i), pm, actions[i%2], tmpls[i%2], func(n int) bool {
			if n == 2 {
				return i/2%10 < 7
			}
			return i%5 < 2
		})
		at = at.Add(time.Second)
	}
	for i := range 80 { // the trusted model's low-confidence answers
		id := task("nova", i)
		conf := TrustedFrom + 0.0025*float64(i%40)
		e := ok(attempt(id, 1, [2]string{TrustedProvider, TrustedModel}, actions[i%2], tmpls[i%2], at), conf)
		a.Events = append(a.Events, e)
		approve := i%10 != 9
		if !patterns {
			approve = i%5 < 2
		}
		decide(id, at, 40*time.Minute, approve)
		at = at.Add(time.Second)
	}
	for i := range 30 { // another model's refusals, rightly refused
		id := task("refusal", i)
		e := ok(attempt(id, 1, [2]string{"openai", "gpt-4o"}, actions[i%2], tmpls[i%2], at), 0.30+0.01*float64(i%25))
		a.Events = append(a.Events, e)
		decide(id, at, 30*time.Minute, i%5 == 0)
		at = at.Add(time.Second)
	}
	for i := range 40 { // business rejections, reviewed by the slow owner
		id := task("biz", i)
		e := attempt(id, 1, [][2]string{{"openai", "gpt-4o"}, {"anthropic", "claude-sonnet"}}[i%2], "refund", "refund-v2", at)
		e.Stage, e.Status = event.StageBusiness, event.StatusError
		e.Error = &event.Error{Type: "BusinessError", HTTPStatus: 422, Code: "insufficient_balance", Message: "account balance too low"}
		a.Events = append(a.Events, e)
		wait := 15*time.Minute + time.Duration(i%11-5)*time.Minute
		if patterns {
			wait = SlowWait + time.Duration(i%21-10)*time.Minute
		}
		decide(id, at, wait, i%4 == 0)
		at = at.Add(time.Second)
	}
	for i := range 40 { // plain successes
		id := task("ok", i)
		a.Events = append(a.Events, ok(attempt(id, 1, [][2]string{{"openai", "gpt-4o"}, {"anthropic", "claude-sonnet"}}[i%2], actions[i%2], tmpls[i%2], at), 0.95))
		at = at.Add(time.Second)
	}
	return a
}
