package store

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// benchState is a realistic task state: a task that timed out once, was
// retried and then succeeded, with its last event (the bulk of the bytes), a
// confirmed WRITE operation and a due retry index entry for one in ten tasks.
func benchState(i int, now int64) *task.State {
	id := fmt.Sprintf("t1-%040x", i*2654435761)
	conf, valid, sla := 0.93, true, int64(86_400_000)
	st := &task.State{
		TaskID:         id,
		SeenEvents:     []string{fmt.Sprintf("ev-%d-1", i), fmt.Sprintf("ev-%d-2", i)},
		Attempts:       2,
		Retries:        1,
		RetriesByClass: map[event.Class]int32{event.ClassNetworkTimeout: 1},
		CostUSD:        0.0213, Tokens: 1840, ElapsedMs: 4210,
		Operations: []task.Operation{{OpID: "op-" + id[:16], Kind: event.OpWrite,
			ParamsSHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", State: event.OpConfirmed}},
		Terminal: true, TerminalClass: event.ClassSucceeded,
		LastClass: event.ClassSucceeded, LastRoute: event.RouteComplete,
		LastEventAt: now - 5_000, LastSeenAt: now, SLAMs: sla,
		LastEvent: &event.TaskEvent{
			EventID: fmt.Sprintf("ev-%d-2", i), TaskID: id, Attempt: 2, OccurredAt: event.FromMillis(now - 5_000),
			Source: "refund-worker", Action: "refund", Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v7",
			Stage: event.StageModel, Status: event.StatusOK,
			Output: &event.Output{Text: "Refund of 49.90 EUR approved for order 1234; the customer is notified by e-mail.", SchemaValid: &valid, Confidence: &conf},
			Usage:  event.Usage{CostUSD: 0.0107, Tokens: 920, ElapsedMs: 2100},
			SLAMs:  &sla,
		},
	}
	if i%10 == 0 {
		st.Terminal, st.TerminalClass = false, ""
		st.Pending = &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: now + 1000}
	}
	return st
}

// benchWrite writes n states in batches of batchSize tasks and returns the
// time it took.
func benchWrite(b *testing.B, s *Store, from, n, batchSize int, now int64) time.Duration {
	b.Helper()
	start := time.Now()
	wb := s.NewBatch()
	for i := from; i < from+n; i++ {
		st := benchState(i, now)
		if err := wb.Put(int32(i%12), nil, st, now+2*st.SLAMs); err != nil {
			b.Fatal(err)
		}
		if (i-from+1)%batchSize == 0 {
			if err := wb.Commit(); err != nil {
				b.Fatal(err)
			}
			wb = s.NewBatch()
		}
	}
	if err := wb.Commit(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkState1M builds the state of 1,000,000 tasks in Pebble with
// batched writes (1,000 tasks a batch, like one poll) and reports its disk
// size, the Go heap in use, Pebble's memtable and block cache, and bytes per
// task. As a baseline measured in the same run it writes 100,000 tasks one
// batch per task and 100,000 in batches of 1,000, and reports the ratio.
// Nothing is asserted. Run it with
//
//	go test -run='^$' -bench=State1M -benchtime=1x ./internal/store/
func BenchmarkState1M(b *testing.B) {
	const (
		tasks    = 1_000_000
		baseline = 100_000
		batch    = 1000
	)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	one, err := benchState(1, now).Marshal()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		// the baseline: each mode on a fresh store of its own
		var unbatched, batched time.Duration
		for _, mode := range []struct {
			size int
			took *time.Duration
		}{{1, &unbatched}, {batch, &batched}} {
			base, err := Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			*mode.took = benchWrite(b, base, 0, baseline, mode.size, now)
			base.Close()
		}

		s, err := Open(b.TempDir(), nil)
		if err != nil {
			b.Fatal(err)
		}
		took := benchWrite(b, s, 0, tasks, batch, now)
		if err := s.db.Flush(); err != nil { // the size of the sstables, not of the WAL
			b.Fatal(err)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		m := s.Metrics()
		disk := m.DiskSpaceUsage()

		b.ReportMetric(float64(disk)/(1<<20), "disk_MiB")
		b.ReportMetric(float64(disk)/tasks, "disk_B/task")
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "go_heap_MiB")
		b.ReportMetric(float64(m.MemTable.Size)/(1<<20), "memtable_MiB")
		b.ReportMetric(float64(m.BlockCache.Size)/(1<<20), "blockcache_MiB")
		b.ReportMetric(float64(len(one)), "state_B")
		b.ReportMetric(float64(took.Nanoseconds())/tasks, "ns/task_1M")
		b.ReportMetric(unbatched.Seconds()/batched.Seconds(), "batched_speedup_x")
		b.Logf("1M tasks: %.1f MiB on disk (%.0f B/task; one state is %d B encoded), Go heap in use %.1f MiB, memtables %.1f MiB, block cache %.1f MiB, built in %s",
			float64(disk)/(1<<20), float64(disk)/tasks, len(one), float64(ms.HeapInuse)/(1<<20),
			float64(m.MemTable.Size)/(1<<20), float64(m.BlockCache.Size)/(1<<20), took.Round(time.Millisecond))
		b.Logf("baseline, %d tasks: one batch per task %s, batches of %d %s: batched is %.1fx faster",
			baseline, unbatched.Round(time.Millisecond), batch, batched.Round(time.Millisecond), unbatched.Seconds()/batched.Seconds())
		s.Close()
	}
}
