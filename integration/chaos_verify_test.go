package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// This file holds the chaos tests' workload (a stream of task events produced
// with franz-go directly) and their verifier (every topic read back with
// read_committed and checked against the ingress topic itself).

// kind is one shape of event in the chaos workload. Every task has exactly one
// event (plus, for some, an exact redelivery), so a retrying task has one
// RETRY decision that nothing supersedes: its retry must be published once.
type kind int

const (
	kSucceeded kind = iota
	kTimeout
	kRefusal
	kFixable
	kRateLimited
	kBusiness
	kDuplicate
	kUnclassified
	nKinds
)

// want is the class and route of the first delivery of each kind.
var want = [nKinds]struct {
	class event.Class
	route event.Route
}{
	kSucceeded:    {event.ClassSucceeded, event.RouteComplete},
	kTimeout:      {event.ClassNetworkTimeout, event.RouteRetry},
	kRefusal:      {event.ClassModelRefusal, event.RouteReview},
	kFixable:      {event.ClassValidationFixable, event.RouteRetry},
	kRateLimited:  {event.ClassRateLimited, event.RouteRetry},
	kBusiness:     {event.ClassBusinessRejected, event.RouteReview},
	kDuplicate:    {event.ClassDuplicateExecution, event.RouteComplete},
	kUnclassified: {event.ClassUnclassified, event.RouteReview},
}

func ptr[T any](v T) *T { return &v }

// chaosEvent builds the event of task i.
func chaosEvent(run string, i int) event.TaskEvent {
	k := kind(i % int(nKinds))
	ev := event.TaskEvent{
		EventID: fmt.Sprintf("%s-e%d", run, i), TaskID: fmt.Sprintf("%s-t%d-k%d", run, i, k), Attempt: 1,
		OccurredAt: event.At(time.Now()), Source: "chaos", Action: "answer_ticket",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "support-v3",
		Usage: event.Usage{CostUSD: 0.01, Tokens: 100, ElapsedMs: 500},
	}
	fail := func(stage event.Stage, e event.Error) {
		ev.Status, ev.Stage, ev.Error = event.StatusError, stage, &e
	}
	switch k {
	case kSucceeded:
		ev.Status, ev.Stage = event.StatusOK, event.StageModel
		ev.Output = &event.Output{Text: "Your refund was issued.", SchemaValid: ptr(true), Confidence: ptr(0.93)}
	case kTimeout:
		fail(event.StageNetwork, event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream timed out"})
	case kRefusal:
		ev.Status, ev.Stage = event.StatusOK, event.StageModel
		ev.Output = &event.Output{Text: "I cannot help with that request.", SchemaValid: ptr(true), Confidence: ptr(0.9)}
	case kFixable:
		fail(event.StageBusiness, event.Error{Type: "ValidationError", Code: fmt.Sprintf("CODE_1%03d", i%1000), Message: "date format"})
	case kRateLimited:
		fail(event.StageNetwork, event.Error{Type: "RateLimitError", HTTPStatus: 429, RetryAfterMs: ptr(int64(100 + i%400))})
	case kBusiness:
		fail(event.StageBusiness, event.Error{Type: "PaymentError", Code: "insufficient_balance"})
	case kDuplicate:
		fail(event.StageBusiness, event.Error{Type: "ConflictError", HTTPStatus: 409, Code: "already_processed"})
	case kUnclassified:
		fail(event.StageProtocol, event.Error{Type: "WeirdError", Message: "something odd"})
	}
	return ev
}

// stream produces a chaos workload to the ingress topic.
type stream struct {
	run          string
	tasks        int // distinct tasks, one event each
	redeliveries int // exact copies of earlier events, produced later
	poison       int // undecodable records
	rate         int // records per second
}

// total is the number of records the stream produces.
func (s stream) total() int { return s.tasks + s.redeliveries + s.poison }

// produce writes the stream to the ingress topic, paced at s.rate, and
// returns once every record is acknowledged.
func (s stream) produce(ctx context.Context, t *testing.T, topic string, produced *atomic.Int64) error {
	c, err := codec.New()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.RecordRetries(1_000_000), kgo.RecordDeliveryTimeout(5*time.Minute))
	if err != nil {
		return err
	}
	defer cl.Close()

	// a redelivery follows its original by 200 to 5,000 records; a poison
	// record lands every tasks/poison records
	rng := rand.New(rand.NewPCG(uint64(len(s.run)), 42))
	later := map[int][]int{}
	for n := 0; n < s.redeliveries; n++ {
		i := rng.IntN(s.tasks)
		at := i + 200 + rng.IntN(4800)
		later[at] = append(later[at], i)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		perr error
	)
	send := func(key string, val []byte) {
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Key: []byte(key), Value: val}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				perr = err
				mu.Unlock()
				return
			}
			produced.Add(1)
		})
	}
	encode := func(i int) []byte {
		ev := chaosEvent(s.run, i)
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Errorf("encode task %d: %v", i, err)
		}
		return v
	}
	begin := time.Now()
	sent, poisoned, redelivered := 0, 0, 0
	pace := func() {
		sent++
		if due := begin.Add(time.Duration(sent) * time.Second / time.Duration(s.rate)); time.Until(due) > 0 && sent%100 == 0 {
			time.Sleep(time.Until(due))
		}
	}
	for pos := 0; pos < s.tasks || redelivered < s.redeliveries; pos++ {
		if pos < s.tasks {
			send(chaosEvent(s.run, pos).TaskID, encode(pos))
			pace()
			if s.poison > 0 && pos%(s.tasks/s.poison) == 0 && poisoned < s.poison {
				send(fmt.Sprintf("%s-poison%d", s.run, poisoned), []byte("not avro at all"))
				poisoned++
				pace()
			}
		}
		for _, i := range later[pos] {
			send(chaosEvent(s.run, i).TaskID, encode(i))
			redelivered++
			pace()
		}
		if ctx.Err() != nil {
			break
		}
	}
	wg.Wait()
	if perr != nil {
		return fmt.Errorf("produce: %w", perr)
	}
	if got := sent; got != s.total() {
		return fmt.Errorf("produce: sent %d records, want %d", got, s.total())
	}
	return nil
}

// readTopic reads every partition of topic from the start to its end with the
// given isolation level and returns the data records (control records are
// used only to know the end was reached).
func readTopic(ctx context.Context, t *testing.T, topic string, committed bool) []*kgo.Record {
	t.Helper()
	recs, _ := readAll(ctx, t, topic, committed)
	return recs
}

// markers counts transaction markers (control records) by type.
type markers struct{ commits, aborts int }

// readAll is readTopic that also counts the transaction markers. Both
// isolation levels read up to the high watermark of now, so that a
// transaction still open is waited for, not cut.
func readAll(ctx context.Context, t *testing.T, topic string, committed bool) ([]*kgo.Record, markers) {
	t.Helper()
	var mk markers
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.FetchMaxBytes(64 << 20)}
	adm, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	starts, err := kadm.NewClient(adm).ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("start offsets of %s: %v", topic, err)
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	ranges := scan.Ranges{}
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, o.Partition)
		ranges.Set(topic, o.Partition, scan.Range{Start: max(0, s.Offset), End: o.Offset})
	})
	var opts []scan.Opt
	if !committed {
		opts = append(opts, scan.Uncommitted())
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var recs []*kgo.Record
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		recs = append(recs, b.Records...)
		for _, r := range b.Markers {
			switch {
			case len(r.Key) >= 4 && r.Key[3] == 1: // control key: int16 version, int16 type (0 abort, 1 commit)
				mk.commits++
			case len(r.Key) >= 4 && r.Key[3] == 0:
				mk.aborts++
			}
		}
		return nil
	}, opts...)
	if err != nil {
		t.Fatalf("read %s: %v", topic, err)
	}
	return recs, mk
}

// inputKey names an input record by its topic-partition-offset.
type inputKey struct {
	topic     string
	partition int32
	offset    int64
}

func (k inputKey) String() string { return fmt.Sprintf("%s/%d@%d", k.topic, k.partition, k.offset) }

// report is what verify found, for the test's log.
type report struct {
	inputs, audit, retries, review, deadletter, dropped int
	abortedRecords                                      int // read_uncommitted minus read_committed, output and state topics
	// stateMarkers are the transaction markers on the state topic, which
	// every transaction writes: one per partition a transaction touched
	stateMarkers markers
}

// verify checks the exactly-once contracts from the topics.
func verify(ctx context.Context, t *testing.T, e *env, s stream) report {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	topic := func(short string) string { return e.prefix + "ai.tasks." + short }
	var rep report

	// the inputs, as produced: what each one must have become
	type expect struct {
		route event.Route
		class event.Class
		task  string
	}
	expected := map[inputKey]expect{}
	firstSeen := map[string]bool{}
	ingress := readTopic(ctx, t, topic("ingress"), true)
	for _, r := range ingress {
		k := inputKey{r.Topic, r.Partition, r.Offset}
		ev, err := c.DecodeTaskEvent(r.Value)
		if err != nil {
			expected[k] = expect{event.RouteDeadLetter, event.ClassInvalidInput, string(r.Key)}
			continue
		}
		w := want[chaosKind(t, ev.TaskID)]
		if firstSeen[ev.EventID] {
			expected[k] = expect{event.RouteDrop, w.class, ev.TaskID}
			continue
		}
		firstSeen[ev.EventID] = true
		expected[k] = expect{w.route, w.class, ev.TaskID}
	}
	rep.inputs = len(ingress)
	if rep.inputs != s.total() {
		t.Errorf("ingress holds %d records, the stream produced %d", rep.inputs, s.total())
	}

	// every input has exactly one audit record, with the expected decision;
	// per task, audit records follow ingress order
	decoded := func(r *kgo.Record) event.Routed {
		rr, err := c.DecodeRouted(r.Value)
		if err != nil {
			t.Fatalf("%s/%d@%d does not decode: %v", r.Topic, r.Partition, r.Offset, err)
		}
		return rr
	}
	audited := map[inputKey]event.Decision{}
	lastOffset := map[string]int64{}
	retryDecisions := map[string]int{}
	auditRecs := readTopic(ctx, t, topic("audit"), true)
	rep.audit = len(auditRecs)
	errs := 0
	fail := func(format string, args ...any) {
		if errs++; errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range auditRecs {
		rr := decoded(r)
		k := inputKey{rr.Input.Topic, rr.Input.Partition, rr.Input.Offset}
		if _, dup := audited[k]; dup {
			fail("input %s has a second audit record at audit %d@%d", k, r.Partition, r.Offset)
		}
		audited[k] = rr.Decision
		x, ok := expected[k]
		if !ok {
			fail("audit %d@%d names input %s, which is not in ingress", r.Partition, r.Offset, k)
			continue
		}
		if rr.Decision.Route != x.route || rr.Decision.Class != x.class {
			fail("input %s of task %s: %s/%s (%s), want %s/%s", k, x.task, rr.Decision.Class, rr.Decision.Route, rr.Decision.Reason, x.class, x.route)
		}
		if last, ok := lastOffset[x.task]; ok && k.offset <= last {
			fail("task %s: audit record for input offset %d after one for offset %d", x.task, k.offset, last)
		}
		lastOffset[x.task] = k.offset
		if rr.Decision.Route == event.RouteDrop {
			rep.dropped++
		}
		if rr.Decision.Route == event.RouteRetry {
			retryDecisions[x.task]++
		}
	}
	for k, x := range expected {
		if _, ok := audited[k]; !ok {
			fail("input %s of task %s has no audit record", k, x.task)
		}
	}

	// every routed outcome exactly once, matched by its input
	routedOnce := func(short string, route event.Route) int {
		recs := readTopic(ctx, t, topic(short), true)
		seen := map[inputKey]bool{}
		for _, r := range recs {
			var k inputKey
			if hdr(r, "faultrouter.error.stage") == "decode" || hdr(r, "faultrouter.error.stage") == "validate" {
				p, _ := strconv.Atoi(hdr(r, "faultrouter.error.partition"))
				o, _ := strconv.ParseInt(hdr(r, "faultrouter.error.offset"), 10, 64)
				k = inputKey{hdr(r, "faultrouter.error.topic"), int32(p), o}
			} else {
				rr := decoded(r)
				k = inputKey{rr.Input.Topic, rr.Input.Partition, rr.Input.Offset}
			}
			if seen[k] {
				fail("%s: input %s routed twice", short, k)
			}
			seen[k] = true
			if d, ok := audited[k]; !ok || d.Route != route && !(route == event.RouteReview && d.Route == event.RouteQuarantine) {
				fail("%s: record %d@%d for input %s, whose audit decision is %v", short, r.Partition, r.Offset, k, d.Route)
			}
		}
		for k, d := range audited {
			if (d.Route == route || route == event.RouteReview && d.Route == event.RouteQuarantine) && !seen[k] {
				fail("%s: input %s routed %s has no record there", short, k, d.Route)
			}
		}
		return len(recs)
	}
	rep.review = routedOnce("review", event.RouteReview)
	rep.deadletter = routedOnce("deadletter", event.RouteDeadLetter)

	// every due retry exactly once: one per RETRY decision of the task
	retryRecs := readTopic(ctx, t, topic("retry"), true)
	rep.retries = len(retryRecs)
	perTask := map[string]int{}
	for _, r := range retryRecs {
		rr := decoded(r)
		if rr.Event == nil {
			fail("retry %d@%d carries no event", r.Partition, r.Offset)
			continue
		}
		perTask[rr.Event.TaskID]++
		if rr.Decision.Retry == nil || rr.Decision.Retry.N != 1 {
			fail("retry of task %s carries plan %+v, want n=1", rr.Event.TaskID, rr.Decision.Retry)
		}
	}
	for task, n := range retryDecisions {
		if perTask[task] != n {
			fail("task %s: %d retry records, want %d (one per RETRY decision)", task, perTask[task], n)
		}
	}
	for task, n := range perTask {
		if retryDecisions[task] == 0 {
			fail("task %s: %d retry records without a RETRY decision", task, n)
		}
	}

	// aborted transactions: what read_uncommitted sees beyond read_committed
	for _, short := range []string{"audit", "review", "deadletter", "retry"} {
		rep.abortedRecords += len(readTopic(ctx, t, topic(short), false)) - len(readTopic(ctx, t, topic(short), true))
	}
	state := e.prefix + "faultrouter.state"
	uncommitted, mk := readAll(ctx, t, state, false)
	rep.abortedRecords += len(uncommitted) - len(readTopic(ctx, t, state, true))
	rep.stateMarkers = mk
	if errs > 20 {
		t.Errorf("... and %d more violations", errs-20)
	}
	return rep
}

func hdr(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

var kindRe = regexp.MustCompile(`-k(\d+)$`)

// chaosKind recovers the kind of a task from its ID.
func chaosKind(t *testing.T, taskID string) kind {
	m := kindRe.FindStringSubmatch(taskID)
	if m == nil {
		t.Fatalf("task %q is not a chaos task", taskID)
	}
	k, _ := strconv.Atoi(m[1])
	return kind(k)
}

// txCounts are the transaction counters scraped from routers' /metrics.
type txCounts struct{ committed, aborted float64 }

var metricRe = regexp.MustCompile(`(?m)^faultrouter_transactions_(committed|aborted)_total (\S+)$`)

// scrape adds the router's transaction counters to c (a killed router loses
// them, so they are scraped just before every kill or stop).
func (c *txCounts) scrape(r *router) {
	out, err := httpGet(r.metrics + "/metrics")
	if err != nil {
		return
	}
	for _, m := range metricRe.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "committed" {
			c.committed += v
		} else {
			c.aborted += v
		}
	}
}
