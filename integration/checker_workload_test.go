package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// This file is the reference-model checker's workload: a seeded random
// stream of task events and review decisions, with every class,
// multi-attempt tasks, 429s, writes whose receipt is lost and receipts that
// arrive later, review decisions, exact redeliveries, re-drives, stragglers
// after a task ended, poison records, breaker resets and provider storms that trip
// the breakers of the default policy. Resets of prompt templates come
// mid-run, each between a hallucination whose item it ends and one whose
// item it must not end (addLatchResets). The same seed gives the same records
// (occurred_at is on a fixed clock), produced at the same stream times.
//
// A compressed workload (for a policy whose durations are divided by a
// factor, compress_test.go) adds the long paths of a task's life, each task
// with an sla_ms of a few seconds so that its TTL passes within the run: a
// review decided after the task's TTL, a write of unknown outcome reconciled
// by a reviewer and an attempt after the reconciled task expired, and an
// exact redelivery after the TTL (routed afresh, not dropped); a model,
// action and template used only in a burst at the stream's start, whose
// breakers must be let go once nothing uses them (addIdleBreakers); and about
// one record in 150 is produced to another partition than its task's.

// workItem is one record of the workload, produced at stream time at.
type workItem struct {
	at       time.Duration
	seq      int
	decision bool // to the decisions topic (else ingress)
	key      string
	value    []byte
	// reset is a person's breaker reset, written as the product writes it
	// (control.ResetBreaker): its RESET record on the breakers topic and
	// the command on every decisions partition, in one transaction
	reset *control.Reset
	// headers are the record's headers (a re-drive's lineage)
	headers []kgo.RecordHeader
	// misplaced goes to another partition than its key's, as a producer
	// with another partitioner would send it: the router forwards it
	misplaced bool
}

// workload is a generated stream.
type workload struct {
	seed       uint64
	compressed bool // the long paths, for a compressed policy
	tasks      int
	duration   time.Duration // stream time the tasks start within
	items      []workItem
	scenario   map[string]int // tasks per scenario
}

var (
	wlProviders = [][2]string{{"openai", "gpt-4o"}, {"anthropic", "claude-sonnet"}, {"qwen", "qwen-max"}, {"mistral", "mistral-large"}}
	wlTemplates = []string{"support-v3", "refund-v9", "contract-v2", "invoice-v5", "summary-v1", "triage-v4"}
	wlActions   = []string{"answer_ticket", "refund", "contract_review", "invoice_extract", "ship_order"}
	// the storm provider fails every model-stage attempt during storms
	wlStormProvider = wlProviders[3]
	wlStormTemplate = wlTemplates[4]
	wlBase          = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// wlHomeStormModel is the model of the home storm (wlLongPaths): used by
// no other scenario.
var wlHomeStormModel = [2]string{"local", "llama-3"}

// homeStormTime picks a stream time in a home storm: 10 s from 12 s in,
// and 10 s from 32 s in.
func homeStormTime(rng *rand.Rand) time.Duration {
	at := 12*time.Second + time.Duration(rng.Int64N(int64(10*time.Second)))
	if rng.IntN(2) == 0 {
		at += 20 * time.Second
	}
	return at
}

// homePartition is the ingress partition of task id (three partitions),
// by the partitioner the workload is produced with.
func homePartition(id string) int32 {
	return int32(homeHash.Partition(&kgo.Record{Key: []byte(id)}, 3))
}

// stormAt reports whether stream time t lies in a provider storm: 12 s out
// of every 45 s, starting 10 s in.
func stormAt(t time.Duration) bool {
	if t < 10*time.Second {
		return false
	}
	return (t-10*time.Second)%(45*time.Second) < 12*time.Second
}

// templateStormAt reports whether stream time t lies in a storm of the storm
// template (its outputs break their schema): 8 s out of every 90 s, 25 s in.
func templateStormAt(t time.Duration) bool {
	if t < 25*time.Second {
		return false
	}
	return (t-25*time.Second)%(90*time.Second) < 8*time.Second
}

// taskGen builds one task's items.
type taskGen struct {
	w      *workload
	rng    *rand.Rand
	c      *codec.Codec
	id     string
	at     time.Duration
	n      int // events so far
	pm     [2]string
	tmpl   string
	action string
	events []event.TaskEvent
	slaMs  *int64 // the task's sla_ms, on every event; nil: the policy's default
}

func (g *taskGen) ev(status event.Status, stage event.Stage) event.TaskEvent {
	g.n++
	e := event.TaskEvent{
		EventID: fmt.Sprintf("%s-e%d", g.id, g.n), TaskID: g.id, Attempt: int32(g.n),
		OccurredAt: event.At(wlBase.Add(g.at)), Source: "checker-worker", Action: g.action,
		Provider: g.pm[0], Model: g.pm[1], PromptTemplate: g.tmpl, Status: status, Stage: stage,
		Usage: event.Usage{CostUSD: float64(1+g.rng.IntN(20)) / 1000, Tokens: int64(50 + g.rng.IntN(300)), ElapsedMs: int64(100 + g.rng.IntN(1500))},
		SLAMs: g.slaMs,
	}
	return e
}

func (g *taskGen) emit(e event.TaskEvent) {
	v, err := g.c.EncodeTaskEvent(nil, &e)
	if err != nil {
		panic(fmt.Sprintf("workload: encode %s: %v", e.EventID, err))
	}
	g.w.add(workItem{at: g.at, key: e.TaskID, value: v})
	g.events = append(g.events, e)
}

func (g *taskGen) decide(approve bool) {
	d := event.ReviewDecision{TaskID: g.id, Approve: approve, Reason: "checked by the checker's reviewer", Reviewer: "checker",
		At: event.At(wlBase.Add(g.at))}
	v, err := g.c.EncodeReviewDecision(nil, &d)
	if err != nil {
		panic(err)
	}
	g.w.add(workItem{at: g.at, decision: true, key: g.id, value: v})
}

func (g *taskGen) wait(lo, hi time.Duration) {
	g.at += lo + time.Duration(g.rng.Int64N(int64(hi-lo)+1))
}

func (g *taskGen) success() event.TaskEvent {
	if g.pm == wlStormProvider && stormAt(g.at) {
		return g.timeout()
	}
	e := g.ev(event.StatusOK, event.StageModel)
	e.Output = &event.Output{Text: "Done: the request was handled.", SchemaValid: ptr(true), Confidence: ptr(0.8 + float64(g.rng.IntN(20))/100)}
	if g.tmpl == wlStormTemplate && templateStormAt(g.at) {
		e.Output.SchemaValid = ptr(false)
	}
	return e
}

func (g *taskGen) fail(stage event.Stage, er event.Error) event.TaskEvent {
	e := g.ev(event.StatusError, stage)
	e.Error = &er
	return e
}

func (g *taskGen) timeout() event.TaskEvent {
	return g.fail(event.StageNetwork, event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream timed out"})
}

func (w *workload) add(it workItem) {
	it.seq = len(w.items)
	w.items = append(w.items, it)
}

// scenarios: name, weight (in thousandths, roughly), script. A script emits the task's records,
// moving g.at forward between them.
var wlScenarios = []struct {
	name   string
	weight int
	run    func(g *taskGen)
}{
	{"succeeded", 240, func(g *taskGen) { g.emit(g.success()) }},
	{"flaky-network", 90, func(g *taskGen) {
		n := 1 + g.rng.IntN(2)
		if g.rng.IntN(8) == 0 {
			n = 3 // a third timeout is dead-lettered
		}
		for range n {
			g.emit(g.timeout())
			g.wait(2500*time.Millisecond, 5*time.Second)
		}
		g.emit(g.success())
	}},
	{"rate-limited", 60, func(g *taskGen) {
		e := g.fail(event.StageNetwork, event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: ptr(int64(200 + g.rng.IntN(800)))})
		g.emit(e)
		g.wait(1500*time.Millisecond, 3*time.Second)
		if g.rng.IntN(3) == 0 { // a second 429 within the window (60 ms compressed): RATE_LIMIT_EXCEEDED
			e2 := g.fail(event.StageNetwork, event.Error{Type: "RateLimitError", HTTPStatus: 429})
			e2.OccurredAt = event.At(e.OccurredAt.Add(time.Duration(10+g.rng.IntN(40)) * time.Millisecond))
			g.emit(e2)
			return
		}
		g.emit(g.success())
	}},
	{"auth-then-review", 40, func(g *taskGen) {
		g.emit(g.fail(event.StageProtocol, event.Error{Type: "AuthenticationError", HTTPStatus: 401, Code: "token_expired"}))
		g.wait(500*time.Millisecond, 2*time.Second)
		g.emit(g.fail(event.StageProtocol, event.Error{Type: "AuthenticationError", HTTPStatus: 401, Code: "invalid_token"}))
		g.wait(2*time.Second, 8*time.Second)
		g.decide(true) // credentials rotated: one more attempt
		g.wait(1*time.Second, 3*time.Second)
		g.emit(g.success())
	}},
	{"validation-loop", 25, func(g *taskGen) {
		code := 1000 + g.rng.IntN(2000) // CODE_1xxx and CODE_2xxx retry with feedback
		for i := range 1 + g.rng.IntN(4) {
			e := g.fail(event.StageBusiness, event.Error{Type: "ValidationError", Code: fmt.Sprintf("CODE_%d", code+i), Message: "field total does not add up"})
			g.emit(e)
			g.wait(500*time.Millisecond, 2*time.Second)
		}
		if g.rng.IntN(2) == 0 {
			g.emit(g.success())
		}
	}},
	{"validation-ambiguous", 10, func(g *taskGen) {
		g.emit(g.fail(event.StageBusiness, event.Error{Type: "ValidationError", Code: fmt.Sprintf("CODE_3%03d", g.rng.IntN(1000))}))
	}},
	{"refusal", 25, func(g *taskGen) {
		e := g.ev(event.StatusOK, event.StageModel)
		e.Output = &event.Output{Text: "I cannot help with that request.", SchemaValid: ptr(true), Confidence: ptr(0.9)}
		g.emit(e)
		g.wait(2*time.Second, 10*time.Second)
		approve := g.rng.IntN(3) == 0
		g.decide(approve)
		if approve {
			g.wait(1*time.Second, 3*time.Second)
			g.emit(g.success())
		}
	}},
	{"hallucination", 1, func(g *taskGen) {
		e := g.ev(event.StatusOK, event.StageModel)
		e.Output = &event.Output{Text: "Your order #99999 shipped yesterday.", SchemaValid: ptr(true), Confidence: ptr(0.95), Flags: []string{"fabricated_data"}}
		g.emit(e)
		// (compressed, content safety's SLA is 60 ms: every item is overdue)
		if !g.w.compressed && g.at < 12*time.Second && g.rng.IntN(2) == 0 {
			g.wait(62*time.Second, 68*time.Second) // past content safety's 1 min SLA: alerted
		} else {
			g.wait(3*time.Second, 15*time.Second)
		}
		g.decide(g.rng.IntN(2) == 0)
	}},
	{"lost-receipt", 40, func(g *taskGen) {
		op := event.Operation{OpID: g.id + "-op", Kind: event.OpWrite, ParamsSHA256: "aa11", State: event.OpSubmitted}
		e := g.timeout()
		e.Stage, e.Operation = event.StageBusiness, &op
		g.emit(e) // OUTCOME_UNKNOWN: held, never retried
		g.wait(3*time.Second, 12*time.Second)
		r := g.ev(event.StatusOK, event.StageBusiness)
		receipt := op
		switch g.rng.IntN(3) {
		case 0:
			receipt.State = event.OpConfirmed
		case 1:
			receipt.State = event.OpRejected
			r.Status, r.Error = event.StatusError, &event.Error{Type: "PaymentError", Code: "account_closed"}
		case 2: // a fail-over model proposes other parameters for the held write
			receipt.ParamsSHA256, receipt.State = "bb22", event.OpPlanned
		}
		r.Operation = &receipt
		g.emit(r)
	}},
	{"params-mismatch", 20, func(g *taskGen) {
		op := event.Operation{OpID: g.id + "-op", Kind: event.OpWrite, ParamsSHA256: "cc33", State: event.OpPlanned}
		e := g.timeout()
		e.Operation = &op
		g.emit(e)
		g.wait(2500*time.Millisecond, 5*time.Second)
		op2 := op
		op2.ParamsSHA256 = "dd44"
		e2 := g.success()
		e2.Operation = &op2
		g.emit(e2)
	}},
	{"budget", 20, func(g *taskGen) {
		for range 3 {
			e := g.timeout()
			e.Usage.CostUSD = 0.2
			g.emit(e)
			g.wait(2500*time.Millisecond, 5*time.Second)
		}
	}},
	{"business-rejected", 30, func(g *taskGen) {
		g.emit(g.fail(event.StageBusiness, event.Error{Type: "PaymentError", HTTPStatus: 422, Code: "insufficient_balance"}))
	}},
	{"input-quality", 30, func(g *taskGen) {
		g.emit(g.fail(event.StageProtocol, event.Error{Type: "BadRequest", HTTPStatus: 400, Code: "invalid_file_format"}))
	}},
	{"schema-violation", 20, func(g *taskGen) {
		e := g.ev(event.StatusOK, event.StageModel)
		e.Output = &event.Output{Text: "{\"total\":", SchemaValid: ptr(false), Confidence: ptr(0.9)}
		g.emit(e)
	}},
	{"unclassified", 30, func(g *taskGen) {
		g.emit(g.fail(event.StageProtocol, event.Error{Type: "WeirdError", Message: "something odd"}))
	}},
	{"downstream-duplicate", 20, func(g *taskGen) {
		g.emit(g.fail(event.StageBusiness, event.Error{Type: "ConflictError", HTTPStatus: 409, Code: "already_processed"}))
	}},
}

// wlLongPaths are the scenarios of a compressed workload: a task's life
// past its TTL. Each task states an SLA of a few seconds (sla_ms), so its
// state lives 2 x that after its last event.
var wlLongPaths = []struct {
	name   string
	weight int
	run    func(g *taskGen)
}{
	// the home storm: the home-storm model fails, in its storms, only on
	// the tasks of ingress partition 0, so only the instance that owns it
	// trips the model's breaker; the others, whose tasks of the model mostly
	// succeed, hold their retries into it only through the OPEN shared on
	// the breakers topic (breaker.open_everywhere)
	{"home-storm", 120, func(g *taskGen) {
		g.pm = wlHomeStormModel
		g.at = homeStormTime(g.rng)
		if homePartition(g.id) == 0 {
			for range 3 {
				g.emit(g.timeout())
				g.wait(200*time.Millisecond, 800*time.Millisecond)
			}
			return // the third timeout is dead-lettered
		}
		if g.rng.IntN(4) == 0 {
			g.emit(g.timeout())
			g.wait(2500*time.Millisecond, 5*time.Second)
		}
		g.emit(g.success())
	}},
	// a refusal (owner ai_product, an SLA far longer than the task's TTL)
	// decided after the task's TTL: the item outlived it and the decision
	// is applied
	{"review-after-ttl", 25, func(g *taskGen) {
		sla := g.sla(1500, 3000)
		e := g.ev(event.StatusOK, event.StageModel)
		e.Output = &event.Output{Text: "I cannot help with that request.", SchemaValid: ptr(true), Confidence: ptr(0.9)}
		g.emit(e)
		g.wait(2*sla+2*time.Second, 2*sla+6*time.Second)
		approve := g.rng.IntN(2) == 0
		g.decide(approve)
		if approve {
			g.wait(1*time.Second, 3*time.Second)
			g.emit(g.success())
		}
	}},
	// a write whose receipt is lost, held as OUTCOME_UNKNOWN (owner
	// operations: overdue in 1.8 s) and reconciled by a reviewer seconds
	// later; approved, it runs again and is confirmed; either way the task
	// then expires, and an attempt after its TTL starts it afresh
	{"unknown-reconciled", 25, func(g *taskGen) {
		sla := g.sla(1500, 3000)
		op := event.Operation{OpID: g.id + "-op", Kind: event.OpWrite, ParamsSHA256: "ee55", State: event.OpSubmitted}
		e := g.timeout()
		e.Stage, e.Operation = event.StageBusiness, &op
		g.emit(e)
		g.wait(3*time.Second, 8*time.Second)
		approve := g.rng.IntN(2) == 0
		g.decide(approve)
		if approve {
			g.wait(1*time.Second, 3*time.Second)
			r := g.success()
			receipt := op
			receipt.State = event.OpConfirmed
			r.Operation = &receipt
			g.emit(r)
		}
		g.wait(2*sla+2*time.Second, 2*sla+5*time.Second)
		g.emit(g.success())
	}},
	// a task that completed, and an exact redelivery of its event after
	// the TTL: routed afresh, not dropped as a duplicate
	{"redelivery-after-ttl", 15, func(g *taskGen) {
		g.sla(1000, 2000)
		e := g.success()
		g.emit(e)
		g.wait(2*time.Duration(*e.SLAMs)*time.Millisecond+2*time.Second, 2*time.Duration(*e.SLAMs)*time.Millisecond+5*time.Second)
		v, _ := g.c.EncodeTaskEvent(nil, &e)
		g.w.add(workItem{at: g.at, key: e.TaskID, value: v})
	}},
}

// sla gives the task's events an SLA between lo and hi ms and returns it.
func (g *taskGen) sla(lo, hi int64) time.Duration {
	ms := lo + g.rng.Int64N(hi-lo+1)
	g.slaMs = &ms
	return time.Duration(ms) * time.Millisecond
}

// newWorkload generates the stream of seed: tasks tasks starting within
// duration of stream time; compressed adds the long paths (wlLongPaths).
func newWorkload(seed uint64, tasks int, duration time.Duration, compressed bool) *workload {
	c, err := codec.New()
	if err != nil {
		panic(err)
	}
	w := &workload{seed: seed, tasks: tasks, duration: duration, scenario: map[string]int{}, compressed: compressed}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	scenarios := wlScenarios
	if compressed {
		scenarios = append(slices.Clone(wlScenarios), wlLongPaths...)
	}
	total := 0
	for _, s := range scenarios {
		total += s.weight
	}
	for i := range tasks {
		g := &taskGen{w: w, rng: rng, c: c, id: fmt.Sprintf("s%d-t%d", seed, i),
			at:     time.Duration(rng.Int64N(int64(duration))),
			pm:     wlProviders[rng.IntN(len(wlProviders))],
			tmpl:   wlTemplates[rng.IntN(len(wlTemplates))],
			action: wlActions[rng.IntN(len(wlActions))]}
		pick := rng.IntN(total)
		for _, s := range scenarios {
			if pick -= s.weight; pick < 0 {
				w.scenario[s.name]++
				s.run(g)
				break
			}
		}
		// an exact redelivery of one of its events, later
		if len(g.events) > 0 && rng.IntN(8) == 0 {
			e := g.events[rng.IntN(len(g.events))]
			g.wait(200*time.Millisecond, 6*time.Second)
			v, _ := c.EncodeTaskEvent(nil, &e)
			w.add(workItem{at: g.at, key: e.TaskID, value: v})
		}
		// an operator re-drives the task's last event (replay --redrive-to),
		// now and then twice by mistake
		if len(g.events) > 0 && rng.IntN(40) == 0 {
			e := g.events[len(g.events)-1]
			g.wait(2*time.Second, 8*time.Second)
			v, _ := c.EncodeTaskEvent(nil, &e)
			rd := codec.Redrive{SourceTopic: "ai.tasks.deadletter", SourcePartition: int32(i % 3), SourceOffset: int64(i), Count: 1,
				Reason: "checker: upstream fixed"}
			hs := codec.AppendRedriveHeaders(nil, &rd)
			w.add(workItem{at: g.at, key: e.TaskID, value: v, headers: hs})
			w.scenario["redrive"]++
			if rng.IntN(4) == 0 {
				g.wait(200*time.Millisecond, 2*time.Second)
				w.add(workItem{at: g.at, key: e.TaskID, value: v, headers: hs})
			}
		}
		// a straggler: one more attempt after the task ended
		if rng.IntN(20) == 0 {
			g.wait(1*time.Second, 5*time.Second)
			g.emit(g.success())
		}
		// a reviewer answers an item that is not open
		if rng.IntN(50) == 0 {
			g.wait(1*time.Second, 5*time.Second)
			g.decide(rng.IntN(2) == 0)
		}
	}
	// poison: about one record in 1000
	poison := len(w.items) / 1000
	for i := range poison {
		at := time.Duration(rng.Int64N(int64(duration)))
		switch i % 3 {
		case 0:
			w.add(workItem{at: at, key: fmt.Sprintf("s%d-poison%d", seed, i), value: []byte("not avro at all")})
		case 1: // a valid event under another task's key
			e := event.TaskEvent{EventID: fmt.Sprintf("s%d-p%d", seed, i), TaskID: fmt.Sprintf("s%d-poisontask%d", seed, i), Attempt: 1,
				OccurredAt: event.At(wlBase.Add(at)), Source: "checker-worker", Action: "refund", Status: event.StatusOK}
			v, _ := c.EncodeTaskEvent(nil, &e)
			w.add(workItem{at: at, key: fmt.Sprintf("s%d-wrongkey%d", seed, i), value: v})
		case 2: // a review decision that does not decode
			w.add(workItem{at: at, decision: true, key: fmt.Sprintf("s%d-poisondecision%d", seed, i), value: []byte{0xc3, 0x01, 1, 2, 3}})
		}
	}
	// a person resets a breaker now and then (the one the storm trips)
	for at := 25 * time.Second; at < duration; at += 40 * time.Second {
		w.addReset(at, breaker.ProviderModel, wlStormProvider[0]+"/"+wlStormProvider[1])
	}
	w.addLatchResets(c)
	if compressed {
		w.addIdleBreakers(c)
		for i := range w.items {
			if w.items[i].reset == nil && rng.IntN(150) == 0 {
				w.items[i].misplaced = true
			}
		}
	}
	slices.SortStableFunc(w.items, func(a, b workItem) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.seq - b.seq
	})
	return w
}

// addUnwritable adds n task events of one attempt each, spread over the
// stream, whose value is size bytes: over what the router's output topics
// take with a decision (checker.Options.MaxOutputBytes), under what ingress
// and --max-record-bytes take, so that the router dead-letters them at
// stage write and routes on. Its own random source leaves the rest of the
// seed's stream as it was.
func (w *workload) addUnwritable(n, size int) {
	c, err := codec.New()
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(w.seed, w.seed^0x5bd1e995))
	for i := range n {
		at := time.Duration(rng.Int64N(int64(w.duration)))
		id := fmt.Sprintf("s%d-unwritable%d", w.seed, i)
		e := event.TaskEvent{EventID: id + "-e1", TaskID: id, Attempt: 1, OccurredAt: event.At(wlBase.Add(at)), Source: "checker-worker",
			Action: "contract_review", Provider: "openai", Model: "gpt-4o", PromptTemplate: "contract-v2", Status: event.StatusOK,
			Stage: event.StageModel, Output: &event.Output{Text: "", SchemaValid: ptr(true), Confidence: ptr(0.9)}}
		v, err := c.EncodeTaskEvent(nil, &e)
		if err != nil {
			panic(err)
		}
		e.Output.Text = strings.Repeat("contract clause; ", (size-len(v))/17+1)
		if v, err = c.EncodeTaskEvent(nil, &e); err != nil {
			panic(err)
		}
		w.add(workItem{at: at, key: id, value: v})
		w.scenario["unwritable"]++
	}
	slices.SortStableFunc(w.items, func(a, b workItem) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.seq - b.seq
	})
}

func (w *workload) addReset(at time.Duration, scope breaker.Scope, key string) {
	w.add(workItem{at: at, key: scope.String() + "/" + key,
		reset: &control.Reset{Scope: scope, Key: key, Reason: "checker: breaker reset", Operator: "checker-operator"}})
}

// wlLatchResets are when, as fractions of the stream's duration, a person
// resets a prompt template mid-run (addLatchResets). In TestChecker's
// 50 s stream the middle three fall while instance b is paused (SIGSTOP,
// 22 s to 38 s), none at the broker's restart (40 s).
var wlLatchResets = []float64{0.28, 0.5, 0.6, 0.7, 0.9}

// addLatchResets adds, at each of wlLatchResets, a person's reset of a
// prompt template (the templates in turn) with two hallucinations of it
// around the reset: one 3 s before it, whose item the RESET ends, and one
// 2 s after it, whose item it must not end (the template stays latched
// until a reviewer decides that item); a reviewer decides each item 4 s to
// 12 s after its hallucination, mid-run. Its own random source leaves the
// rest of the seed's stream as it was.
func (w *workload) addLatchResets(c *codec.Codec) {
	rng := rand.New(rand.NewPCG(w.seed, w.seed^0x2545f4914f6cdd1d))
	for i, f := range wlLatchResets {
		at := time.Duration(f * float64(w.duration))
		tmpl := wlTemplates[i%len(wlTemplates)]
		for j, d := range []time.Duration{-3 * time.Second, 2 * time.Second} {
			g := &taskGen{w: w, rng: rng, c: c, id: fmt.Sprintf("s%d-latchreset%d-%d", w.seed, i, j), at: max(0, at+d),
				pm: wlProviders[rng.IntN(len(wlProviders))], tmpl: tmpl, action: wlActions[rng.IntN(len(wlActions))]}
			e := g.ev(event.StatusOK, event.StageModel)
			e.Output = &event.Output{Text: "Your refund of $999 was approved yesterday.", SchemaValid: ptr(true), Confidence: ptr(0.95),
				Flags: []string{"fabricated_data"}}
			g.emit(e)
			g.wait(4*time.Second, 12*time.Second)
			g.decide(rng.IntN(2) == 0)
			w.scenario["latch-reset"]++
		}
		w.addReset(at, breaker.PromptTemplate, tmpl)
	}
	slices.SortStableFunc(w.items, func(a, b workItem) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.seq - b.seq
	})
}

// wlIdleModel, wlIdleTemplate and wlIdleAction are used only by the burst
// of addIdleBreakers: the drain resets none of them.
var (
	wlIdleModel    = [2]string{"legacy", "model-v0"}
	wlIdleTemplate = "legacy-v0"
	wlIdleAction   = "legacy_export"
)

// addIdleBreakers adds a burst at the stream's start of tasks of a model,
// action and template no other task uses: 120 tasks within 1.5 s, from
// 0.3 s in, each a timeout and nothing after it, with an SLA of 1 s. The
// timeouts open the model's breaker; its retries are held and given up
// (2 x SLA after their due time) or let through as probes whose outcome
// never comes, and the breaker, left OPEN or HALF_OPEN, is used by no one
// again: every instance must let it go and tombstone its state on the
// breakers topic (breaker.not_let_go, breaker.shared_not_let_go). The drain
// does not reset it. Its own random source leaves the rest of the seed's
// stream as it was.
func (w *workload) addIdleBreakers(c *codec.Codec) {
	rng := rand.New(rand.NewPCG(w.seed, w.seed^0x1b873593))
	for i := range 120 {
		w.idleTimeout(rng, c, fmt.Sprintf("s%d-idle%d", w.seed, i), 300*time.Millisecond+time.Duration(i)*1500*time.Millisecond/120, 0)
		w.scenario["idle-breaker"]++
	}
	slices.SortStableFunc(w.items, func(a, b workItem) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.seq - b.seq
	})
}

// idleBurst returns the items of a burst like addIdleBreakers', at offsets
// from 0, for round's model, template and action (idleNames), which no
// other task uses: what the quiet stretch produces when the faults left
// the first burst's breakers nothing to let go (cluster.idleSettled).
func (w *workload) idleBurst(round int) []workItem {
	c, err := codec.New()
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(w.seed+uint64(round), w.seed^0x1b873593))
	tmp := &workload{seed: w.seed, scenario: map[string]int{}}
	for i := range 120 {
		tmp.idleTimeout(rng, c, fmt.Sprintf("s%d-idle%d-%d", w.seed, round, i), time.Duration(i)*1500*time.Millisecond/120, round)
	}
	return tmp.items
}

// idleTimeout adds task id of an idle burst: round's model, template and
// action (idleNames), at at, a timeout with an SLA of 1 s and nothing after it.
func (w *workload) idleTimeout(rng *rand.Rand, c *codec.Codec, id string, at time.Duration, round int) {
	pm, tmpl, action := idleNames(round)
	g := &taskGen{w: w, rng: rng, c: c, id: id, at: at, pm: pm, tmpl: tmpl, action: action}
	g.sla(1000, 1000)
	g.emit(g.timeout())
}

// idleNames are the model, template and action of an idle burst: round 0
// is addIdleBreakers', later rounds idleBurst's.
func idleNames(round int) (pm [2]string, tmpl, action string) {
	if round == 0 {
		return wlIdleModel, wlIdleTemplate, wlIdleAction
	}
	return [2]string{wlIdleModel[0], fmt.Sprintf("model-v%d", round)}, fmt.Sprintf("legacy-v%d", round), fmt.Sprintf("%s_%d", wlIdleAction, round)
}

// returning are the tasks of the quiet stretch after a run (runChecker's
// returns): in each of rounds, one task per home partition that succeeds
// with an SLA of 1 s (first), expires, comes back after its tombstone with
// a new attempt under the default SLA (again), and has that attempt
// redelivered exactly once more (redelivered), a duplicate to drop.
type returning struct {
	ids                       []string
	first, again, redelivered []workItem
}

// returns builds the returning tasks of round round, on partitions
// partitions, with a random source of their own.
func (w *workload) returns(round, partitions int) returning {
	c, err := codec.New()
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(w.seed+uint64(round), w.seed^0x85ebca6b))
	tmp := &workload{seed: w.seed, scenario: map[string]int{}}
	var r returning
	for p := range partitions {
		id := ""
		for k := 0; ; k++ {
			id = fmt.Sprintf("s%d-return%d-%d", w.seed, round, k)
			if homePartition(id) == int32(p) {
				break
			}
		}
		r.ids = append(r.ids, id)
		g := &taskGen{w: tmp, rng: rng, c: c, id: id, at: w.duration + time.Duration(60+10*round)*time.Second,
			pm: wlProviders[0], tmpl: wlTemplates[0], action: wlActions[0]}
		ok := func() event.TaskEvent {
			e := g.ev(event.StatusOK, event.StageModel)
			e.Output = &event.Output{Text: "Done: the request was handled.", SchemaValid: ptr(true), Confidence: ptr(0.9)}
			return e
		}
		g.sla(1000, 1000)
		e := ok()
		v, _ := c.EncodeTaskEvent(nil, &e)
		r.first = append(r.first, workItem{key: id, value: v})
		g.slaMs = nil
		g.wait(5*time.Second, 5*time.Second)
		e = ok()
		v, _ = c.EncodeTaskEvent(nil, &e)
		r.again = append(r.again, workItem{key: id, value: v})
		r.redelivered = append(r.redelivered, workItem{key: id, value: v})
	}
	return r
}

// finalResets resets every breaker the workload can trip: the drain at the
// end of a run, so that no retry stays held behind a breaker that nothing
// closes any more.
func (w *workload) finalResets(at time.Duration) []workItem {
	tail := &workload{}
	for _, pm := range append(slices.Clone(wlProviders), wlHomeStormModel) {
		tail.addReset(at, breaker.ProviderModel, pm[0]+"/"+pm[1])
	}
	for _, a := range wlActions {
		tail.addReset(at, breaker.Downstream, a)
	}
	for _, t := range wlTemplates {
		tail.addReset(at, breaker.PromptTemplate, t)
	}
	return tail.items
}

// homeHash is the Java client's partitioner, as the router computes a
// task's partition.
var homeHash = kgo.StickyKeyPartitioner(nil).ForTopic("")

// produce writes items to the topics of prefix, each at its stream time
// (scaled by speed: 1 is real time) after began. partitions is the decisions
// topic's partition count (a misplaced record goes to another one than its
// key's). A reset is written as the product writes it, before the items
// after it are produced, so that the records of hallucinations after it
// come after its RESET record.
func produceItems(ctx context.Context, prefix string, items []workItem, partitions int, began time.Time, produced *atomic.Int64) error {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.ProducerLinger(5 * time.Millisecond), kgo.RecordRetries(1_000_000), kgo.RecordDeliveryTimeout(5 * time.Minute),
		// ingress's max.message.bytes: unwritable events are near it
		kgo.ProducerBatchMaxBytes(1 << 20),
		kgo.MetadataMinAge(time.Second), kgo.MetadataMaxAge(2 * time.Second)} // partitions added while it streams are written to soon
	cl, err := kgo.NewClient(opts...) // keys hashed like the Java client, as workers do
	if err != nil {
		return err
	}
	defer cl.Close()
	manual, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...) // resets: every partition
	if err != nil {
		return err
	}
	defer manual.Close()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		perr error
	)
	// a record that fails (a broker restart can fail one for good) is sent
	// again: a copy that did land is just one more input to the checker,
	// which models whatever the committed input log holds
	var send func(cl *kgo.Client, r *kgo.Record, tries int)
	send = func(cl *kgo.Client, r *kgo.Record, tries int) {
		wg.Add(1)
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			switch {
			case err != nil && tries < 20 && ctx.Err() == nil:
				again := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
				wg.Add(1)
				go func() { // never block the client's callbacks
					defer wg.Done()
					time.Sleep(500 * time.Millisecond)
					send(cl, again, tries+1)
				}()
			case err != nil:
				mu.Lock()
				perr = err
				mu.Unlock()
			default:
				produced.Add(1)
			}
		})
	}
	ingress, decisions := prefix+"ai.tasks.ingress", prefix+"ai.tasks.review.decisions"
	cdc, err := codec.New()
	if err != nil {
		return err
	}
	topics := control.Topics{Decisions: decisions, Breakers: prefix + "faultrouter.breakers"}
	// reset writes a person's reset, again after a failure for up to 3
	// minutes (a broker restart fails them meanwhile): a reset that did
	// commit is just one more
	reset := func(r control.Reset) error {
		for began := time.Now(); ; {
			_, err := control.ResetBreaker(ctx, []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}, cdc, topics, r)
			if err == nil || time.Since(began) > 3*time.Minute || ctx.Err() != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, it := range items {
		if d := time.Until(began.Add(it.at)); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		switch {
		case it.misplaced:
			topic := ingress
			if it.decision {
				topic = decisions
			}
			r := &kgo.Record{Topic: topic, Key: []byte(it.key), Value: it.value, Headers: it.headers}
			r.Partition = int32((homeHash.Partition(r, partitions) + 1) % partitions)
			send(manual, r, 0)
		case it.reset != nil:
			if err := reset(*it.reset); err != nil {
				mu.Lock()
				perr = fmt.Errorf("breaker reset %s: %w", it.key, err)
				mu.Unlock()
				continue
			}
			produced.Add(1)
		case it.decision:
			send(cl, &kgo.Record{Topic: decisions, Key: []byte(it.key), Value: it.value}, 0)
		default:
			send(cl, &kgo.Record{Topic: ingress, Key: []byte(it.key), Value: it.value, Headers: it.headers}, 0)
		}
	}
	wg.Wait()
	return perr
}
