package router

import (
	"io"
	"log/slog"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/store"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BenchmarkRestoreApply restores a changelog of 100k tasks (175k records:
// three quarters of the tasks written twice, a pending retry and then its
// publication, and a tenth ended by a tombstone) over 6 partitions into an
// empty store in two windows, as a restore from an empty state directory
// does without the broker. It reports the CPU (user+system, all cores) per
// changelog record, the compactions of what it wrote included: the figure
// the restore is bounded by.
func BenchmarkRestoreApply(b *testing.B) {
	c, err := codec.New()
	if err != nil {
		b.Fatal(err)
	}
	const tasks, parts = 100_000, 6
	now := time.Now().UnixMilli()
	var recs []*kgo.Record
	offs := make([]int64, parts)
	add := func(id string, st *task.State) {
		p := int32(len(id) % parts)
		if n, err := strconv.Atoi(id[5:]); err == nil {
			p = int32(n % parts)
		}
		r := &kgo.Record{Key: []byte(id), Partition: p, Offset: offs[p]}
		offs[p]++
		if st != nil {
			if r.Value, err = c.EncodeState(nil, st); err != nil {
				b.Fatal(err)
			}
		}
		recs = append(recs, r)
	}
	for i := range tasks {
		id := "task-" + strconv.Itoa(i)
		st := &task.State{TaskID: id, SeenEvents: []string{"ev-" + id + "-1"}, Attempts: 1,
			CostUSD: 0.01, Tokens: 1200, ElapsedMs: 800, ExpiresAt: now + 86_400_000}
		if i%4 != 0 {
			st.Pending = &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: now + int64(i)}
			add(id, st)
			st.Pending = nil
			st.SeenEvents = append(st.SeenEvents, "ev-"+id+"-2")
			st.Retries = 1
		}
		if i%10 == 0 {
			add(id, nil)
			continue
		}
		add(id, st)
	}
	per := len(recs)/2 + 1 // restore.go: a window is at most half of a restore
	b.ResetTimer()
	var cpu time.Duration
	for range b.N {
		b.StopTimer()
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		s, err := store.Open(b.TempDir(), log)
		if err != nil {
			b.Fatal(err)
		}
		r := &Router{log: log, codec: c, store: s}
		wiped := map[int32]bool{}
		for p := range int32(parts) {
			wiped[p] = true
		}
		c0 := cpuTime()
		b.StartTimer()
		a := r.newApplier(wiped)
		win := newWindow(per)
		for i, rec := range recs {
			win.add(rec)
			if (i+1)%per == 0 {
				if err := a.send(win); err != nil {
					b.Fatal(err)
				}
				win = newWindow(per)
			}
		}
		win.final = true
		if err := a.send(win); err != nil {
			b.Fatal(err)
		}
		if err := a.close(); err != nil {
			b.Fatal(err)
		}
		if st, err := s.Get("task-1"); err != nil || st == nil || st.Retries != 1 {
			b.Fatalf("task-1 restored as %+v, %v", st, err)
		}
		if testing.Verbose() {
			b.Logf("%s", s.Metrics())
		}
		// Close waits for the compactions the restore started: their CPU
		// is the restore's
		s.Close()
		b.StopTimer()
		cpu += cpuTime() - c0
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*len(recs)), "cpu-ns/record")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
