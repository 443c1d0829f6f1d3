package router

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/store"
)

// BenchmarkRecordCPU measures the CPU a batch spends per input record outside
// Kafka: decode, the batched state read, the policy's decision, the audit,
// routed and changelog records, the breakers, the sweep and the Pebble write
// of the committed states: handle's work for a poll, without the broker. The
// backlog is the bench's (bench/workload.go): 10k tasks of three attempts in
// a realistic mix of classes, in polls of 5000 records on 6 partitions. It
// reports the CPU (user+system, every core) and the allocations per record.
//
//	go test -run='^$' -bench=RecordCPU -benchtime=5x ./pkg/router
func BenchmarkRecordCPU(b *testing.B) {
	const tasks, parts, perPoll = 10_000, 6, 5000
	c, err := codec.New()
	if err != nil {
		b.Fatal(err)
	}
	topics := Topics{Ingress: "ingress", Decisions: "decisions", Retry: "retry", Review: "review",
		Audit: "audit", DeadLetter: "deadletter", Alerts: "alerts", State: "state"}
	t0 := time.UnixMilli(1_800_000_000_000)
	hash := kgo.StickyKeyPartitioner(nil).ForTopic("")
	var recs []*kgo.Record
	offs := make([]int64, parts)
	for lo := 0; lo < tasks; lo += 500 {
		for a := 1; a <= 3; a++ {
			for i := lo; i < lo+500; i++ {
				ev := benchWorkloadEvent(i, a, t0.Add(time.Duration(a)*1500*time.Millisecond))
				v, err := c.EncodeTaskEvent(nil, &ev)
				if err != nil {
					b.Fatal(err)
				}
				rec := &kgo.Record{Topic: topics.Ingress, Key: []byte(ev.TaskID), Value: v, Timestamp: t0}
				rec.Partition = int32(hash.Partition(rec, parts))
				rec.Offset = offs[rec.Partition]
				offs[rec.Partition]++
				recs = append(recs, rec)
			}
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var cpu time.Duration
	var allocs uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		s, err := store.Open(b.TempDir(), log)
		if err != nil {
			b.Fatal(err)
		}
		pol := policy.Default()
		brk, err := newBreakers(pol, nil)
		if err != nil {
			b.Fatal(err)
		}
		r := &Router{log: log, codec: c, store: s, brk: brk, metrics: newMetrics(nil),
			owned: map[int32]bool{}, refused: map[inputAt]refused{}, home: parts, hash: hash,
			limits: &limits{byTopic: map[string]int{}, batchMax: defaultMaxMessageBytes}}
		r.cfg = Default()
		r.cfg.Topics, r.cfg.Policy = topics, pol
		for p := range int32(parts) {
			r.owned[p] = true
		}
		r.seen = partitionCounts{ingress: parts, decisions: parts, state: parts}
		bt := newBatch()
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		a0 := ms.Mallocs
		c0 := cpuTime()
		b.StartTimer()
		now := t0.Add(5 * time.Second)
		for lo := 0; lo < len(recs); lo += perPoll {
			if err := r.routeBatch(bt, recs[lo:min(lo+perPoll, len(recs))], now); err != nil {
				b.Fatal(err)
			}
			now = now.Add(200 * time.Millisecond)
		}
		b.StopTimer()
		cpu += cpuTime() - c0
		runtime.ReadMemStats(&ms)
		allocs += ms.Mallocs - a0
		if st, err := s.Get(string(recs[0].Key)); err != nil || st == nil || st.Attempts == 0 {
			b.Fatalf("task %s stored as %+v, %v", recs[0].Key, st, err)
		}
		s.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*len(recs)), "cpu-ns/record")
	b.ReportMetric(float64(allocs)/float64(b.N*len(recs)), "allocs/record")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}

// routeBatch is handle without Kafka: the batch is committed as soon as it
// is decided and its states written at once.
func (r *Router) routeBatch(b *batch, recs []*kgo.Record, now time.Time) error {
	b.reset()
	r.beginBreakers()
	b.recs = append(b.recs, recs...)
	b.inputs = slices.Grow(b.inputs, len(b.recs))[:len(b.recs)]
	r.decodeAll(b.recs, b.inputs)
	for i := range b.inputs {
		if id := b.inputs[i].taskID(); id != "" {
			b.ids = append(b.ids, id)
		}
	}
	if err := r.store.Load(b.ids, b.states); err != nil {
		return err
	}
	r.forgetExpired(b, now)
	for i := range b.inputs {
		n := len(b.out)
		r.route(&b.inputs[i], b, now)
		for _, rec := range b.out[n:] {
			b.origin[rec] = b.inputs[i].rec
		}
		r.observe(&b.inputs[i], b, now)
	}
	if err := r.sweep(b, now); err != nil {
		return err
	}
	r.changelog(b, now)
	r.commitBreakers(b)
	return r.persist(b, now)
}

// benchWorkloadEvent is attempt n of task i of bench/workload.go's mix:
// transient timeouts, rate limits, fixable validation errors, refusals,
// credentials, business rejections, a write without receipt, successes and
// exact redeliveries.
func benchWorkloadEvent(i, n int, at time.Time) event.TaskEvent {
	rng := rand.New(rand.NewPCG(1, uint64(i)))
	id := fmt.Sprintf("bench-%08d", i)
	sla := int64(6 * 3600 * 1000)
	e := event.TaskEvent{
		EventID: fmt.Sprintf("%s-a%d", id, n), TaskID: id, Attempt: int32(n),
		OccurredAt: event.At(at), Source: "support-bot",
		Action:         []string{"answer_ticket", "refund", "contract_review", "summarize", "extract_invoice"}[rng.IntN(5)],
		Provider:       []string{"openai", "anthropic", "google", "mistral"}[rng.IntN(4)],
		Model:          []string{"gpt-4o", "claude-sonnet", "gemini-pro", "mistral-large", "gpt-4o-mini", "claude-haiku"}[rng.IntN(6)],
		PromptTemplate: fmt.Sprintf("tmpl-%02d-v3", rng.IntN(40)),
		Status:         event.StatusOK,
		Usage:          event.Usage{CostUSD: 0.0004 + float64(rng.IntN(40))/10000, Tokens: int64(200 + rng.IntN(600)), ElapsedMs: int64(300 + rng.IntN(4000))},
		InputRef:       &event.InputRef{URI: "s3://tickets/" + id + ".json", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", SizeBytes: int64(1000 + rng.IntN(50000))},
		SLAMs:          &sla,
		Attributes:     map[string]string{"tenant": fmt.Sprintf("tenant-%d", rng.IntN(20)), "region": "eu-west-1"},
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
