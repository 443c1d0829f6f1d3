package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	bench "github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// rssFloor is the resident set under which TestMemorySoak lets it grow: a
// router's Go heap at this load, Pebble's block cache and two memtables.
const rssFloor = 256 << 20

// heapFloor is the Go heap under which TestMemorySoak lets it grow: at this
// load a router's heap is about 10 MiB and moves by a few MiB with the
// machine's load (a slower poll holds a larger batch), while a leak of even
// 16 bytes per routed record passes it within the hour.
const heapFloor = 32 << 20

// breakersFloor is the number of breakers under which TestMemorySoak lets
// an instance's set grow, and liveKeysFloor the number of live keys of the
// breakers topic: the steady mix names 69 keys (24 provider/models, 5
// actions, 40 templates), and the generations in use at once name about 64
// more (churnGenerations), while every generation that came and went adds
// churnKeys: a set or topic that keeps them passes either floor within
// minutes.
const (
	breakersFloor = 200
	liveKeysFloor = 200
)

// latchItemsFloor is the number of latch items under which TestMemorySoak
// lets an instance's count grow: the churn opens genTemplates items every
// genEvery, each decided hallucinationReview later, so about a dozen are
// open at a time.
const latchItemsFloor = 100

// TestMemorySoak (`make soak-memory DURATION=1h`) guards that the router's
// memory, its circuit breakers and the breakers topic's live keys are
// bounded by what is in flight, not by how long it has run nor by how many
// providers, models, actions and prompt templates it has seen: two
// instances of one group route a steady stream of new tasks (make bench's
// mix, three attempts each, a reviewer deciding one task in ten some
// seconds later, after the task's own TTL) and a churn of names
// (churnStream: a new generation of provider/models, actions and templates
// every genEvery, each used for genLife and never again, with bursts of
// timeouts and 5xx that open their provider/model and downstream breakers,
// and hallucinations that latch their templates until a reviewer decides
// them) on the default policy with every duration divided by 1,000
// (compressedPolicy), so tasks, review items, expiries and breakers turn
// over many times. A breaker unused for twice its scope's cooldown and
// window is let go (breaker.Set.Expire, every 10 s): compressed, 180 ms
// for a provider/model or downstream breaker, 720 ms for a template's.
//
// Each instance's resident set, Go heap, breakers (faultrouter_breakers,
// every scope and state) and latch items (faultrouter_breaker_latch_items)
// are sampled, and the breakers topic is read from its start at each sample
// for its live keys (those whose latest record is not a tombstone, whether
// compaction has run or not). After the first quarter of the run (warm-up:
// the live tasks grow to their steady number) none may keep growing: the
// last quarter's mean is within 25% of the second quarter's, or under its
// floor (rssFloor, heapFloor, breakersFloor, latchItemsFloor,
// liveKeysFloor). Skipped unless FAULTROUTER_MEMORY_SOAK_DURATION is set.
func TestMemorySoak(t *testing.T) {
	d := os.Getenv("FAULTROUTER_MEMORY_SOAK_DURATION")
	if d == "" {
		t.Skip("FAULTROUTER_MEMORY_SOAK_DURATION is unset (make soak-memory sets it)")
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur < 4*time.Minute {
		t.Fatalf("FAULTROUTER_MEMORY_SOAK_DURATION=%q: want a duration of at least 4m", d)
	}
	e := newEnv(t)
	set, err := topicspec.Load(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	breakersTopic, err := set.Name("breakers")
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := compressedPolicy(t, nil) // compress_test.go
	routers := map[string]*router{}
	names := []string{"a", "b"}
	for _, n := range names {
		routers[n] = e.startRouter(n, t.TempDir(), "--policy", pol)
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()
	var produced, generations atomic.Int64
	done := make(chan error, 2)
	go func() { done <- steadyStream(ctx, e.prefix, dur, 200, &produced) }()
	go func() { done <- churnStream(ctx, e.prefix, dur, &produced, &generations) }()

	type sample struct {
		at                    time.Duration
		produced, generations int64
		rss, heap, brk, items map[string]float64
		topic                 topicKeys
	}
	var samples []sample
	expo := map[string]string{} // each instance's last exposition
	every := dur / 40
	began := time.Now()
	for time.Since(began) < dur {
		time.Sleep(every)
		s := sample{at: time.Since(began), produced: produced.Load(), generations: generations.Load(),
			rss: map[string]float64{}, heap: map[string]float64{}, brk: map[string]float64{}, items: map[string]float64{}}
		for n, r := range routers {
			out, err := httpGet(r.metrics + "/metrics")
			if err != nil {
				t.Fatalf("router %s: %v; logs:\n%s", n, err, tailLines(r.logs.String(), 30))
			}
			expo[n] = out
			s.rss[n], _ = metricValue(out, "process_resident_memory_bytes")
			s.heap[n], _ = metricValue(out, "go_memstats_heap_inuse_bytes")
			s.brk[n] = metricSum(out, "faultrouter_breakers")
			s.items[n], _ = metricValue(out, "faultrouter_breaker_latch_items")
		}
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		s.topic, err = readBreakersTopic(rctx, breakersTopic)
		rcancel()
		if err != nil {
			t.Fatalf("reading %s: %v", breakersTopic, err)
		}
		samples = append(samples, s)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "elapsed\tproduced\tgenerations\tnames seen\ta RSS MiB\ta heap MiB\tb RSS MiB\tb heap MiB\t"+
		"a breakers\tb breakers\ta latch items\tb latch items\ttopic records\ttopic keys\tlive keys\tlive items\t")
	for _, s := range samples {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%d\t%d\t%d\t\n",
			s.at.Round(time.Second), s.produced, s.generations, steadyKeys+s.generations*churnKeys,
			s.rss["a"]/(1<<20), s.heap["a"]/(1<<20), s.rss["b"]/(1<<20), s.heap["b"]/(1<<20),
			s.brk["a"], s.brk["b"], s.items["a"], s.items["b"],
			s.topic.records, s.topic.keys, s.topic.live, s.topic.liveItems)
	}
	tw.Flush()

	type series struct {
		name  string
		unit  string  // MiB, or empty for a count
		floor float64 // in bytes for MiB
		pick  func(sample) float64
	}
	var all []series
	for _, n := range names {
		all = append(all,
			series{"router " + n + " RSS", "MiB", rssFloor, func(s sample) float64 { return s.rss[n] }},
			series{"router " + n + " heap", "MiB", heapFloor, func(s sample) float64 { return s.heap[n] }},
			series{"router " + n + " breakers", "", breakersFloor, func(s sample) float64 { return s.brk[n] }},
			series{"router " + n + " latch items", "", latchItemsFloor, func(s sample) float64 { return s.items[n] }})
	}
	all = append(all, series{"breakers topic live keys", "", liveKeysFloor, func(s sample) float64 { return float64(s.topic.live) }})
	q := len(samples) / 4
	for _, sr := range all {
		mean := func(ss []sample) float64 {
			sum := 0.0
			for _, s := range ss {
				sum += sr.pick(s)
			}
			return sum / float64(len(ss))
		}
		second, last := mean(samples[q:2*q]), mean(samples[len(samples)-q:])
		show := func(v float64) string {
			if sr.unit == "MiB" {
				return fmt.Sprintf("%.0f MiB", v/(1<<20))
			}
			return fmt.Sprintf("%.1f", v)
		}
		t.Logf("%s: mean %s in the second quarter, %s in the last", sr.name, show(second), show(last))
		// the resident set also holds Pebble's block cache (64 MiB) and
		// memtables (32 MiB each), which fill for a while: it may grow
		// until it reaches rssFloor; the heap until heapFloor; the
		// breakers, latch items and live keys until what the generations
		// in use at once name
		if last > 1.25*second && last > sr.floor {
			t.Errorf("%s keeps growing: mean %s in the last quarter against %s in the second",
				sr.name, show(last), show(second))
		}
	}

	// the flat counts say something only if the churn opened and latched
	// breakers and wrote latch items that were decided
	opened := map[string]float64{}
	for _, n := range names {
		for _, sc := range []string{"PROVIDER_MODEL", "DOWNSTREAM", "PROMPT_TEMPLATE"} {
			v, _ := metricValue(expo[n], `faultrouter_breaker_transitions_total{scope="`+sc+`",to="OPEN"}`)
			opened[sc] += v
		}
	}
	end := samples[len(samples)-1].topic
	t.Logf("breakers opened (both instances): %v; generations %d, names seen %d; the breakers topic: %d records, %d keys (%d latch items), %d live",
		opened, samples[len(samples)-1].generations, steadyKeys+samples[len(samples)-1].generations*churnKeys,
		end.records, end.keys, end.items, end.live)
	for sc, v := range opened {
		if v == 0 {
			t.Errorf("no %s breaker opened: the churn did not exercise them", sc)
		}
	}
	if end.items == 0 || end.liveItems >= end.items {
		t.Errorf("the breakers topic has %d latch item keys, %d of them live: want hallucinations' items, decided", end.items, end.liveItems)
	}
}

// metricSum returns the sum of every sample of one metric family of a
// Prometheus text exposition, whatever their labels.
func metricSum(exposition, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(?:\{[^}]*\})? (\S+)$`)
	sum := 0.0
	for _, m := range re.FindAllStringSubmatch(exposition, -1) {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// topicKeys is what a read of the breakers topic from its start found: its
// records, its keys, those of latch items, and the live ones (whose latest
// record is not a tombstone: what compaction keeps, whether it has run or
// not).
type topicKeys struct {
	records, keys, items, live, liveItems int
}

// readBreakersTopic reads topic from its start to its last stable offsets
// (read_committed) and counts its keys.
func readBreakersTopic(ctx context.Context, topic string) (topicKeys, error) {
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		return topicKeys{}, err
	}
	defer cl.Close()
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		return topicKeys{}, err
	}
	var k topicKeys
	live := map[string]bool{}
	err = scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		for _, r := range b.Records {
			k.records++
			live[string(r.Key)] = r.Value != nil
		}
		return nil
	})
	for key, l := range live {
		item := strings.HasPrefix(key, event.BreakerItemPrefix)
		k.keys++
		if item {
			k.items++
		}
		if l {
			k.live++
			if item {
				k.liveItems++
			}
		}
	}
	return k, err
}

// soakProducer produces the soak's records, counting those delivered and
// keeping the first error.
type soakProducer struct {
	cl       *kgo.Client
	produced *atomic.Int64
	err      atomic.Pointer[error]
}

func newSoakProducer(produced *atomic.Int64) (*soakProducer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordRetries(1_000_000), kgo.RecordDeliveryTimeout(5*time.Minute))
	if err != nil {
		return nil, err
	}
	return &soakProducer{cl: cl, produced: produced}, nil
}

func (p *soakProducer) send(ctx context.Context, topic, key string, v []byte) {
	p.cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
		if err != nil {
			p.err.CompareAndSwap(nil, &err)
			return
		}
		p.produced.Add(1)
	})
}

// finish waits for the records sent and returns the first error.
func (p *soakProducer) finish(ctx context.Context) error {
	p.cl.Flush(ctx)
	if e := p.err.Load(); e != nil {
		return *e
	}
	return nil
}

// steadyStream produces, at rate new tasks a second for dur, three attempts
// of each task a second apart (internal/workload's mix, each task's SLA 30 s, so
// that it expires a minute after its last event), and for one task in ten a
// reviewer's decision 70 s after its first attempt, past its TTL.
func steadyStream(ctx context.Context, prefix string, dur time.Duration, rate int, produced *atomic.Int64) error {
	c, err := codec.New()
	if err != nil {
		return err
	}
	p, err := newSoakProducer(produced)
	if err != nil {
		return err
	}
	defer p.cl.Close()
	ingress, decisions := prefix+"ai.tasks.ingress", prefix+"ai.tasks.review.decisions"
	sla := int64(30_000)
	type due struct {
		at   time.Time
		task int
		n    int // attempt, or 0 for the review decision
	}
	var queue []due
	began, next := time.Now(), 0
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			if now.Sub(began) >= dur {
				tick.Stop()
				return p.finish(ctx)
			}
			for ; next < int(now.Sub(began).Seconds()*float64(rate)); next++ {
				queue = append(queue, due{now, next, 1}, due{now.Add(time.Second), next, 2}, due{now.Add(2 * time.Second), next, 3})
				if next%10 == 0 {
					queue = append(queue, due{now.Add(70 * time.Second), next, 0})
				}
			}
			slices.SortStableFunc(queue, func(a, b due) int { return a.at.Compare(b.at) })
			for len(queue) > 0 && !queue[0].at.After(now) {
				d := queue[0]
				queue = queue[1:]
				id := fmt.Sprintf("%s-%08d", "soak", d.task)
				if d.n == 0 {
					rd := event.ReviewDecision{TaskID: id, Approve: d.task%20 == 0, Reason: "checked", Reviewer: "soak", At: event.At(now)}
					v, err := c.EncodeReviewDecision(nil, &rd)
					if err != nil {
						return err
					}
					p.send(ctx, decisions, id, v)
					continue
				}
				ev := bench.Event("soak", 1, d.task, d.n, now)
				ev.SLAMs = &sla
				v, err := c.EncodeTaskEvent(nil, &ev)
				if err != nil {
					return err
				}
				p.send(ctx, ingress, id, v)
			}
		}
	}
}

// The churn of names: a generation of genPMs provider/models, genActions
// actions and genTemplates prompt templates begins every genEvery and is
// used for genLife, then never again; churnGenerations are in use at once.
const (
	genEvery, genLife                = 20 * time.Second, time.Minute
	churnGenerations                 = int(genLife / genEvery)
	genPMs, genActions, genTemplates = 4, 4, 8
	churnKeys                        = genPMs + genActions + genTemplates
	// steadyKeys are the breakers the steady mix names: 24 provider/models
	// (internal/workload), 5 actions, 40 templates
	steadyKeys = 24 + 5 + 40
	// churnRate is the churn's new tasks a second, over the generations in
	// use; burstTasks the tasks of one burst of failures
	churnRate, burstTasks = 20, 90
	// hallucinationReview is how long after a hallucination its review item
	// is decided
	hallucinationReview = 30 * time.Second
)

// generation is the names of generation g.
type generation struct {
	pms       [genPMs][2]string // provider, model
	actions   [genActions]string
	templates [genTemplates]string
}

func newGeneration(g int) generation {
	var n generation
	for i := range n.pms {
		n.pms[i] = [2]string{fmt.Sprintf("churn-g%05d-p%d", g, i/2), fmt.Sprintf("model-%d", i%2)}
	}
	for i := range n.actions {
		n.actions[i] = fmt.Sprintf("churn-g%05d-action-%d", g, i)
	}
	for i := range n.templates {
		n.templates[i] = fmt.Sprintf("churn-g%05d-tmpl-%d", g, i)
	}
	return n
}

// name gives ev the provider/model pm, the action a and the template tpl of
// the generation.
func (n *generation) name(ev *event.TaskEvent, pm, a, tpl int) {
	ev.Provider, ev.Model = n.pms[pm%genPMs][0], n.pms[pm%genPMs][1]
	ev.Action = n.actions[a%genActions]
	ev.PromptTemplate = n.templates[tpl%genTemplates]
}

// churnStream produces, for dur, the churn of names: a new generation
// every genEvery, whose names churnRate new tasks a second (make bench's
// mix, three attempts a second apart) share with the other generations in
// use, for genLife. Each generation also has
//   - a hallucination on each of its templates, 10 s into its life and 5 s
//     apart, each decided hallucinationReview later (its latch ends then,
//     after the generation's last use for the last ones);
//   - 30 s into its life, a burst of burstTasks network timeouts on its
//     first provider/model and of 503s from its first action (attempts 1
//     and 2 fail, 3 succeeds a second apart): both breakers open, and
//     close on the successes;
//   - at the end of its life, a burst of burstTasks failed first attempts
//     on each of its provider/models and actions, never followed: their
//     breakers open and nothing is heard of them again.
//
// generations counts the generations begun.
func churnStream(ctx context.Context, prefix string, dur time.Duration, produced, generations *atomic.Int64) error {
	c, err := codec.New()
	if err != nil {
		return err
	}
	p, err := newSoakProducer(produced)
	if err != nil {
		return err
	}
	defer p.cl.Close()
	ingress, decisions := prefix+"ai.tasks.ingress", prefix+"ai.tasks.review.decisions"
	sla := int64(30_000)
	type due struct {
		at     time.Time
		ev     *event.TaskEvent // nil: the review decision of task
		task   string
		reject bool
	}
	var queue []due
	timeout := func(ev *event.TaskEvent) {
		ev.Stage, ev.Status, ev.Output, ev.Operation = event.StageNetwork, event.StatusError, nil, nil
		ev.Error = &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream request timed out after 30000 ms"}
	}
	unavailable := func(ev *event.TaskEvent) {
		ev.Stage, ev.Status, ev.Output, ev.Operation = event.StageBusiness, event.StatusError, nil, nil
		ev.Error = &event.Error{Type: "ServiceUnavailable", HTTPStatus: 503, Message: "the downstream service is unavailable"}
	}
	ok := func(ev *event.TaskEvent) {
		ev.Stage, ev.Status, ev.Error, ev.Output, ev.Operation = event.StageModel, event.StatusOK, nil, nil, nil
	}
	var bursts int
	// burst queues burstTasks tasks from at whose attempts fail (attempts
	// fails, then one success), or only their first attempt (fails 1, then
	// nothing)
	burst := func(n *generation, at time.Time, pm, a int, fail func(*event.TaskEvent), fails int, follow bool) {
		for range burstTasks {
			bursts++
			for k := 1; k <= 3; k++ {
				if !follow && k > 1 {
					break
				}
				ev := bench.Event("burst", 4, bursts, k, at)
				ev.EventID, ev.Attempt = fmt.Sprintf("%s-a%d", ev.TaskID, k), int32(k)
				n.name(&ev, pm, a, bursts)
				if k <= fails {
					fail(&ev)
				} else {
					ok(&ev)
				}
				queue = append(queue, due{at: at.Add(time.Duration(k-1) * time.Second), ev: &ev})
			}
		}
	}
	begin := func(g int, start time.Time) {
		n := newGeneration(g)
		for i := range genTemplates {
			at := start.Add(10*time.Second + time.Duration(i)*5*time.Second)
			ev := bench.Event("hallucination", 5, g*genTemplates+i, 1, at)
			ev.EventID, ev.Attempt = ev.TaskID+"-a1", 1
			n.name(&ev, i, i, i)
			ok(&ev)
			ev.Output = &event.Output{Text: "Your order #99999 shipped yesterday.", SchemaValid: ptr(true), Confidence: ptr(0.95),
				Flags: []string{"fabricated_data"}}
			queue = append(queue, due{at: at, ev: &ev}, due{at: at.Add(hallucinationReview), task: ev.TaskID, reject: i%2 == 0})
		}
		mid := start.Add(30 * time.Second)
		burst(&n, mid, 0, 0, timeout, 2, true)
		burst(&n, mid, 0, 0, unavailable, 2, true)
		end := start.Add(genLife)
		for i := range genPMs {
			burst(&n, end, i, i, timeout, 1, false)
		}
		for i := range genActions {
			burst(&n, end, i, i, unavailable, 1, false)
		}
	}
	began, begun, next := time.Now(), 0, 0
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			elapsed := now.Sub(began)
			if elapsed >= dur {
				tick.Stop()
				return p.finish(ctx)
			}
			for ; time.Duration(begun)*genEvery <= elapsed; begun++ {
				begin(begun, began.Add(time.Duration(begun)*genEvery))
				generations.Store(int64(begun + 1))
			}
			// the generations in use: begun less than genLife ago
			first := 0
			if elapsed >= genLife {
				first = int((elapsed-genLife)/genEvery) + 1
			}
			for ; next < int(elapsed.Seconds()*churnRate); next++ {
				n := newGeneration(first + next%(begun-first))
				for k := 1; k <= 3; k++ {
					ev := bench.Event("churn", 2, next, k, now)
					n.name(&ev, next, next/genPMs, next/(genPMs*genActions))
					queue = append(queue, due{at: now.Add(time.Duration(k-1) * time.Second), ev: &ev})
				}
			}
			slices.SortStableFunc(queue, func(a, b due) int { return a.at.Compare(b.at) })
			for len(queue) > 0 && !queue[0].at.After(now) {
				d := queue[0]
				queue = queue[1:]
				if d.ev == nil {
					rd := event.ReviewDecision{TaskID: d.task, Approve: !d.reject, Reason: "checked", Reviewer: "soak", At: event.At(now)}
					v, err := c.EncodeReviewDecision(nil, &rd)
					if err != nil {
						return err
					}
					p.send(ctx, decisions, d.task, v)
					continue
				}
				d.ev.OccurredAt = event.At(now)
				d.ev.SLAMs = &sla
				v, err := c.EncodeTaskEvent(nil, d.ev)
				if err != nil {
					return err
				}
				p.send(ctx, ingress, d.ev.TaskID, v)
			}
		}
	}
}
