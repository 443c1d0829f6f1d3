package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	bench "github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// rssFloor is the resident set under which TestMemorySoak lets it grow: a
// router's Go heap at this load, Pebble's block cache and two memtables.
const rssFloor = 256 << 20

// heapFloor is the Go heap under which TestMemorySoak lets it grow: at this
// load a router's heap is about 10 MiB and moves by a few MiB with the
// machine's load (a slower poll holds a larger batch), while a leak of even
// 16 bytes per routed record passes it within the hour.
const heapFloor = 32 << 20

// TestMemorySoak (`make soak-memory DURATION=1h`) guards that the router's
// memory is bounded by what is in flight, not by how long it has run: two
// instances of one group route a steady stream of new tasks (make bench's
// mix, three attempts each, a reviewer deciding one task in ten some
// seconds later, after the task's own TTL) on the default policy with every
// duration divided by 1,000 (compressedPolicy), so tasks, review items and
// expiries turn over many times. Each instance's resident set and Go heap are sampled; after the
// first quarter of the run (warm-up: the live tasks grow to their steady
// number) neither may keep growing: the last quarter's mean is within 25%
// of the second quarter's, or under rssFloor for the resident set (Pebble's
// cache fills for a while) and heapFloor for the heap. Skipped unless FAULTROUTER_MEMORY_SOAK_DURATION
// is set.
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
	pol, _ := compressedPolicy(t) // compress_test.go
	routers := map[string]*router{}
	for _, n := range []string{"a", "b"} {
		routers[n] = e.startRouter(n, t.TempDir(), "--policy", pol)
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()
	var produced atomic.Int64
	done := make(chan error, 1)
	go func() { done <- steadyStream(ctx, e.prefix, dur, 200, &produced) }()

	type sample struct {
		at        time.Duration
		rss, heap map[string]float64
		produced  int64
	}
	var samples []sample
	every := dur / 40
	began := time.Now()
	for time.Since(began) < dur {
		time.Sleep(every)
		s := sample{at: time.Since(began), rss: map[string]float64{}, heap: map[string]float64{}, produced: produced.Load()}
		for n, r := range routers {
			out, err := httpGet(r.metrics + "/metrics")
			if err != nil {
				t.Fatalf("router %s: %v; logs:\n%s", n, err, tailLines(r.logs.String(), 30))
			}
			s.rss[n], _ = metricValue(out, "process_resident_memory_bytes")
			s.heap[n], _ = metricValue(out, "go_memstats_heap_inuse_bytes")
		}
		samples = append(samples, s)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "elapsed\tproduced\ta RSS MiB\ta heap MiB\tb RSS MiB\tb heap MiB\t")
	for _, s := range samples {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t\n", s.at.Round(time.Second), s.produced,
			s.rss["a"]/(1<<20), s.heap["a"]/(1<<20), s.rss["b"]/(1<<20), s.heap["b"]/(1<<20))
	}
	tw.Flush()
	q := len(samples) / 4
	for _, n := range []string{"a", "b"} {
		for name, pick := range map[string]func(sample) float64{
			"RSS":  func(s sample) float64 { return s.rss[n] },
			"heap": func(s sample) float64 { return s.heap[n] },
		} {
			mean := func(ss []sample) float64 {
				sum := 0.0
				for _, s := range ss {
					sum += pick(s)
				}
				return sum / float64(len(ss))
			}
			second, last := mean(samples[q:2*q]), mean(samples[len(samples)-q:])
			t.Logf("router %s %s: mean %.0f MiB in the second quarter, %.0f MiB in the last", n, name, second/(1<<20), last/(1<<20))
			// the resident set also holds Pebble's block cache (64 MiB)
			// and memtables (32 MiB each), which fill for a while: it may
			// grow until it reaches rssFloor; the heap until heapFloor
			floor := float64(heapFloor)
			if name == "RSS" {
				floor = rssFloor
			}
			if last > 1.25*second && last > floor {
				t.Errorf("router %s: %s keeps growing: mean %.0f MiB in the last quarter against %.0f MiB in the second",
					n, name, last/(1<<20), second/(1<<20))
			}
		}
	}
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordRetries(1_000_000), kgo.RecordDeliveryTimeout(5*time.Minute))
	if err != nil {
		return err
	}
	defer cl.Close()
	ingress, decisions := prefix+"ai.tasks.ingress", prefix+"ai.tasks.review.decisions"
	sla := int64(30_000)
	var perr atomic.Pointer[error]
	send := func(topic, key string, v []byte) {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				perr.CompareAndSwap(nil, &err)
				return
			}
			produced.Add(1)
		})
	}
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
				cl.Flush(ctx)
				if p := perr.Load(); p != nil {
					return *p
				}
				return nil
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
					send(decisions, id, v)
					continue
				}
				ev := bench.Event("soak", 1, d.task, d.n, now)
				ev.SLAMs = &sla
				v, err := c.EncodeTaskEvent(nil, &ev)
				if err != nil {
					return err
				}
				send(ingress, id, v)
			}
		}
	}
}
