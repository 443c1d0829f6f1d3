package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BenchmarkDecide measures the default policy's decision per event on the
// mix of make bench's backlog (bench/workload.go): tasks of three attempts,
// mostly transient timeouts, then rate limits (the third attempt an exact
// redelivery), fixable validation errors, refusals, credentials, business
// rejections, writes without receipt and successes. One op is one event,
// decided on its task's evolving state, as the router does.
//
//	go test -run='^$' -bench=Decide -benchmem ./pkg/policy
func BenchmarkDecide(b *testing.B) {
	p := Default()
	now := time.UnixMilli(1_800_000_000_000)
	const tasks = 100
	evs := make([][3]event.TaskEvent, tasks)
	for i := range tasks {
		for n := 1; n <= 3; n++ {
			evs[i][n-1] = benchEvent(i, n, now)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var st task.State
	for i := 0; i < b.N; i++ {
		ev := &evs[(i/3)%tasks][i%3]
		if i%3 == 0 {
			st = task.State{}
		}
		_ = p.DecideEvent(ev, &st, nil, now)
	}
}

// benchEvent is attempt n of task i of the bench's mix.
func benchEvent(i, n int, now time.Time) event.TaskEvent {
	id := fmt.Sprintf("bench-%08d", i)
	sla := int64(6 * 3600 * 1000)
	e := event.TaskEvent{
		EventID: fmt.Sprintf("%s-a%d", id, n), TaskID: id, Attempt: int32(n),
		OccurredAt: event.At(now.Add(time.Duration(n) * 1500 * time.Millisecond)), Source: "support-bot",
		Action: "answer_ticket", Provider: "openai", Model: "gpt-4o", PromptTemplate: fmt.Sprintf("tmpl-%02d-v3", i%40),
		Status:     event.StatusOK,
		Usage:      event.Usage{CostUSD: 0.0004 + float64(i%40)/10000, Tokens: int64(200 + i%600), ElapsedMs: int64(300 + i%4000)},
		InputRef:   &event.InputRef{URI: "s3://tickets/" + id + ".json", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", SizeBytes: 1000},
		SLAMs:      &sla,
		Attributes: map[string]string{"tenant": fmt.Sprintf("tenant-%d", i%20), "region": "eu-west-1"},
	}
	failed := func(stage event.Stage, x *event.Error) { e.Stage, e.Status, e.Error = stage, event.StatusError, x }
	switch pick := i % 100; {
	case pick < 40: // timeout, timeout, ok
		if n < 3 {
			failed(event.StageNetwork, &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream request timed out after 30000 ms"})
		}
	case pick < 52: // rate limited, ok, redelivered ok
		switch n {
		case 1:
			ms := int64(500)
			failed(event.StageProtocol, &event.Error{Type: "RateLimitError", HTTPStatus: 429, Message: "Rate limit reached for requests", RetryAfterMs: &ms})
		case 3:
			e.EventID, e.Attempt = fmt.Sprintf("%s-a%d", id, n-1), int32(n-1)
		}
	case pick < 64: // validation CODE_1xxx, CODE_2xxx, ok
		if n < 3 {
			failed(event.StageBusiness, &event.Error{Type: "ValidationError", Code: []string{"CODE_1003", "CODE_2101"}[n-1], Message: "field total does not match the sum of the line items"})
		}
	case pick < 74: // refusal, then two late attempts
		if n == 1 {
			v := true
			e.Stage, e.Status = event.StageModel, event.StatusError
			e.Output = &event.Output{Text: "I'm sorry, but I can't help with that request.", SchemaValid: &v}
		}
	case pick < 82: // auth 401, auth 401, ok
		if n < 3 {
			failed(event.StageProtocol, &event.Error{Type: "AuthenticationError", HTTPStatus: 401, Code: "token_expired"})
		}
	case pick < 90: // business rejected, then two late attempts
		if n == 1 {
			failed(event.StageBusiness, &event.Error{Type: "BusinessError", HTTPStatus: 422, Code: "insufficient_balance", Message: "account balance too low"})
		}
	case pick < 95: // write submitted without receipt, then confirmed
		st := event.OpSubmitted
		if n > 1 {
			st = event.OpConfirmed
		}
		e.Operation = &event.Operation{OpID: "op-" + id, Kind: event.OpWrite, ParamsSHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", State: st}
		if n == 1 {
			failed(event.StageNetwork, &event.Error{Type: "TimeoutError", HTTPStatus: 504})
		}
	}
	return e
}
