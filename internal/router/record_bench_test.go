package router

import (
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/internal/router/forward"
	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/internal/router/refuse"
	"github.com/faultrouter/faultrouter/internal/router/sweep"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// BenchmarkRecordCPU measures the CPU a batch spends per input record outside
// Kafka: decode, the batched state read, the policy's decision, the audit,
// routed and changelog records, the breakers, the sweep and the Pebble write
// of the committed states, the metrics and the log line of each decision:
// handle's work for a poll, without the broker, logging as `faultrouter run`
// does by default. The
// backlog is the bench's (internal/workload): 10k tasks of three attempts in
// a realistic mix of classes, in polls of 5000 records on 6 partitions. It
// reports the CPU (user+system, every core) and the allocations per record.
//
//	go test -run='^$' -bench=RecordCPU -benchtime=5x ./internal/router
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
				ev := workload.Event("bench", 1, i, a, t0.Add(time.Duration(a)*1500*time.Millisecond))
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
	// the log of `faultrouter run` by default (text, info: a line per
	// decision), written to /dev/null: the write is paid, not the disk
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devNull.Close()
	log, closeLog, err := logging.NewAsync(devNull, logging.FormatText, "info")
	if err != nil {
		b.Fatal(err)
	}
	defer closeLog()
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
		brk, err := hold.New(pol, nil)
		if err != nil {
			b.Fatal(err)
		}
		r := &Router{log: log, codec: c, store: s, metrics: newMetrics(nil), out: emit.New(c, log),
			owned:  map[int32]bool{},
			limits: refuse.Defaults()}
		r.cfg = Default()
		r.cfg.Topics, r.cfg.Policy = topics, pol
		for p := range int32(parts) {
			r.owned[p] = true
		}
		r.fwd = forward.New(topics, 0, log, forward.Metrics{}, nil)
		r.fwd.Assume(forward.Counts{Ingress: parts, Decisions: parts, State: parts})
		r.attachBreakers(brk)
		r.unw = refuse.New(topics, log, r.ownedSet)
		r.dec = r.decoder()
		r.swp = sweep.New(r.cfg.Policy, r.cfg.Topics.State, log, s, owner{r}, r.alertFunc())
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
		if st, err := s.Get(recs[0].Partition, string(recs[0].Key)); err != nil || st == nil || st.Attempts == 0 {
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
// is decided, its states written at once and its decisions counted.
func (r *Router) routeBatch(b *batch, recs []*kgo.Record, now time.Time) error {
	b.reset()
	r.brk.Begin(now)
	b.recs = append(b.recs, recs...)
	b.inputs = slices.Grow(b.inputs, len(b.recs))[:len(b.recs)]
	r.dec.All(b.recs, nil, func(i int) *decode.Input { return &b.inputs[i].Input })
	b.routedIDs()
	if err := r.store.Load(b.ids, b.partition, b.states); err != nil {
		return err
	}
	r.swp.ForgetExpired(b, now)
	for i := range b.inputs {
		n := len(b.out)
		r.route(&b.inputs[i], b, now)
		b.outOf = append(b.outOf, [2]int32{int32(n), int32(len(b.out))})
		r.observe(&b.inputs[i], b, now)
	}
	if err := r.brk.ReleaseHeld(b.states, b.Load, now); err != nil {
		return err
	}
	if err := r.swp.Sweep(b, now); err != nil {
		return err
	}
	if err := r.publishDue(b, now); err != nil {
		return err
	}
	r.changelog(b, now)
	r.brk.Commit()
	if err := r.persist(b, now); err != nil {
		return err
	}
	r.countCommitted(b)
	return nil
}

// cpuTime is the process's CPU time so far (user and system, all cores).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
