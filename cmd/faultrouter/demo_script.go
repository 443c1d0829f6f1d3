package main

import (
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// demoScript is the demo's stream: one or more tasks for every failure class
// of docs/design.md, a redelivered event, and a lost-receipt write that is later
// confirmed. Events of a task are a second apart, starting at t0.
func demoScript(t0 time.Time) []event.TaskEvent {
	var evs []event.TaskEvent
	n := 0
	add := func(task string, attempt int32, sec int, mod func(*event.TaskEvent)) {
		n++
		e := event.TaskEvent{
			EventID: task + "-e" + itoa(int(attempt)), TaskID: task, Attempt: attempt,
			OccurredAt: event.At(t0.Add(time.Duration(sec) * time.Second)),
			Source:     "support-bot", Action: "answer_ticket",
			Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3",
			Status: event.StatusError,
			Usage:  event.Usage{CostUSD: 0.01, Tokens: 200, ElapsedMs: 800},
		}
		mod(&e)
		evs = append(evs, e)
	}
	errOf := func(typ string, status int32, code, msg string) *event.Error {
		return &event.Error{Type: typ, HTTPStatus: status, Code: code, Message: msg}
	}
	f := func(v bool) *bool { return &v }
	conf := func(v float64) *float64 { return &v }

	add("t-ok", 1, 0, func(e *event.TaskEvent) { e.Status = event.StatusOK; e.Stage = event.StageModel })
	for i := int32(1); i <= 3; i++ {
		add("t-timeout", i, int(i), func(e *event.TaskEvent) {
			e.Stage, e.Error = event.StageNetwork, errOf("TimeoutError", 504, "", "upstream timed out")
		})
	}
	for i := int32(1); i <= 2; i++ {
		add("t-auth", i, int(i), func(e *event.TaskEvent) {
			e.Stage, e.Error = event.StageProtocol, errOf("AuthError", 401, "token_expired", "token expired")
		})
	}
	add("t-input", 1, 0, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageProtocol, errOf("BadRequest", 400, "file_too_large", "file exceeds 20 MB")
		e.InputRef = &event.InputRef{URI: "s3://inputs/t-input.pdf", SHA256: "9f2c", SizeBytes: 31 << 20}
	})
	add("t-refusal", 1, 0, func(e *event.TaskEvent) {
		e.Status, e.Stage, e.Error = event.StatusOK, event.StageModel, nil
		e.Output = &event.Output{Text: "抱歉，我无法回答这个问题。", SchemaValid: f(true), Confidence: conf(0.9)}
	})
	add("t-lowconf", 1, 0, func(e *event.TaskEvent) {
		e.Status, e.Stage = event.StatusOK, event.StageModel
		e.Output = &event.Output{Text: "The contract term is 12 months.", SchemaValid: f(true), Confidence: conf(0.61)}
	})
	add("t-schema", 1, 0, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageModel, errOf("SchemaError", 0, "", "required field amount missing")
		e.Output = &event.Output{Text: "{}", SchemaValid: f(false)}
	})
	add("t-validate", 1, 0, func(e *event.TaskEvent) {
		e.Action, e.Stage = "contract_review", event.StageBusiness
		e.Error = errOf("ValidationError", 0, "CODE_2101", "end date before start date")
	})
	add("t-dup", 1, 0, func(e *event.TaskEvent) {
		e.Action, e.Stage, e.Error = "refund", event.StageBusiness, errOf("Conflict", 409, "already_processed", "refund already issued")
	})
	add("t-balance", 1, 0, func(e *event.TaskEvent) {
		e.Action, e.Stage, e.Error = "refund", event.StageBusiness, errOf("BusinessError", 422, "insufficient_balance", "balance too low")
	})
	add("t-halluc", 1, 0, func(e *event.TaskEvent) {
		e.Status, e.Stage, e.Error = event.StatusOK, event.StageModel, nil
		e.Output = &event.Output{Text: "Order #123 shipped on 2026-02-30.", SchemaValid: f(true), Confidence: conf(0.97), Flags: []string{"fabricated_data"}}
	})
	add("t-429", 1, 0, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageProtocol, errOf("RateLimitError", 429, "", "slow down")
	})
	add("t-429", 2, 20, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageProtocol, errOf("RateLimitError", 429, "", "slow down")
	})
	add("t-budget", 1, 0, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageModel, errOf("TimeoutError", 504, "", "model timed out")
		e.Usage = event.Usage{CostUSD: 0.62, Tokens: 2800, ElapsedMs: 29000}
	})
	add("t-ship", 1, 0, func(e *event.TaskEvent) {
		e.Action, e.Stage = "reship_order", event.StageBusiness
		e.Error = errOf("ConnectionResetError", 0, "", "connection reset before the receipt")
		e.Operation = &event.Operation{OpID: "op-ship-1", Kind: event.OpWrite, ParamsSHA256: "aa11", State: event.OpUnknown}
	})
	add("t-ship", 2, 30, func(e *event.TaskEvent) {
		e.Action, e.Stage, e.Model = "reship_order", event.StageBusiness, "qwen-max"
		e.Operation = &event.Operation{OpID: "op-ship-1", Kind: event.OpWrite, ParamsSHA256: "bb22", State: event.OpPlanned}
	})
	add("t-ship", 3, 60, func(e *event.TaskEvent) {
		e.Action, e.Stage, e.Status = "reship_order", event.StageBusiness, event.StatusOK
		e.Operation = &event.Operation{OpID: "op-ship-1", Kind: event.OpWrite, ParamsSHA256: "aa11", State: event.OpConfirmed}
	})
	add("t-odd", 1, 0, func(e *event.TaskEvent) {
		e.Stage, e.Error = event.StageProtocol, errOf("TLSHandshakeError", 0, "", "certificate signed by unknown authority")
	})
	// a redelivery of the first event: routed once, dropped once
	evs = append(evs, evs[0])
	return evs
}
