package restore

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BenchmarkRestoreApply restores a changelog of 40k or 100k tasks (1.75
// records a task of about 600 bytes, a state with its last event whole:
// three quarters of the tasks written twice, a pending retry and then its
// publication, and a tenth ended by a tombstone) over 6 partitions into an
// empty store, as a restore from an empty state directory does without the
// broker: in groups of partitions, a window each, the records handed over
// in fetches of 1000. It reports the CPU (user+system, all cores) and the
// time per changelog record, the compactions of what it wrote included.
// Nothing here overlaps the writes with the read of the topic, as a restore
// does: the time is that of the writes alone.
//
// The last case restores the 100k tasks in windows of 8 MiB, so that each
// partition (about 17 MiB of changelog) is written in two or three windows,
// as a partition larger than the 64 MiB window is.
func BenchmarkRestoreApply(b *testing.B) {
	for _, tasks := range []int{40_000, 100_000} {
		b.Run(fmt.Sprintf("tasks=%d", tasks), func(b *testing.B) { benchmarkRestoreApply(b, tasks) })
	}
	b.Run("tasks=100000/window=8MiB", func(b *testing.B) {
		defer func(n int) { restoreWindow = n }(restoreWindow)
		restoreWindow = 8 << 20
		benchmarkRestoreApply(b, 100_000)
	})
}

func benchmarkRestoreApply(b *testing.B, tasks int) {
	c, err := codec.New()
	if err != nil {
		b.Fatal(err)
	}
	const parts = 6
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
		// a state as the router writes it: with its last event whole
		ev := &event.TaskEvent{EventID: "ev-" + id + "-1", TaskID: id, Attempt: 1, OccurredAt: event.At(time.UnixMilli(now)),
			Source: "support-bot", Action: "refund", Provider: "openai", Model: "gpt-4o", PromptTemplate: "tmpl-14-v3",
			Stage: event.StageProtocol, Status: event.StatusError,
			Error:    &event.Error{Type: "AuthenticationError", HTTPStatus: 401, Code: "token_expired", Message: "the API key has expired"},
			Usage:    event.Usage{CostUSD: 0.0042, Tokens: 731, ElapsedMs: 894},
			InputRef: &event.InputRef{URI: "s3://tickets/" + id + ".json", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", SizeBytes: 4096}}
		st := &task.State{TaskID: id, SeenEvents: []string{"ev-" + id + "-1"}, Attempts: 1,
			RetriesByClass: map[event.Class]int32{event.ClassAuthFailed: 1},
			CostUSD:        0.01, Tokens: 1200, ElapsedMs: 800, ExpiresAt: now + 86_400_000,
			Review: task.ReviewOpen, ReviewClass: event.ClassAuthFailed, ReviewOwner: "security", ReviewDueAt: now + 3_600_000,
			LastClass: event.ClassAuthFailed, LastRoute: event.RouteReview, FirstEventAt: now, LastEventAt: now, LastSeenAt: now,
			SLAMs: 21_600_000, LastEvent: ev}
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
	// read in groups of partitions, as a restore reads them
	ranges := map[int32]scan.Range{}
	for p, n := range offs {
		ranges[int32(p)] = scan.Range{End: n}
	}
	var groups [][]*kgo.Record
	for _, g := range restoreGroups("state", ranges, restoreGroup/restoreRecordBytes) {
		var recsOf []*kgo.Record
		for _, r := range recs {
			if _, ok := g["state"][r.Partition]; ok {
				recsOf = append(recsOf, r)
			}
		}
		groups = append(groups, recsOf)
	}
	b.ResetTimer()
	var cpu time.Duration
	for range b.N {
		b.StopTimer()
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		s, err := store.Open(b.TempDir(), log)
		if err != nil {
			b.Fatal(err)
		}
		wiped := map[int32]bool{}
		for p := range int32(parts) {
			wiped[p] = true
		}
		c0 := cpuTime()
		b.StartTimer()
		rs := New(Config{Store: s, Log: log}).newWriter(wiped)
		for _, g := range groups {
			rs.hint(int64(len(g)))
			for i := 0; i < len(g); i += 1000 { // fetches of 1000 records
				if err := rs.add(g[i:min(i+1000, len(g))], nil); err != nil {
					b.Fatal(err)
				}
			}
			rs.endWindow()
		}
		if err := rs.close(); err != nil {
			b.Fatal(err)
		}
		if st, err := s.Get(1, "task-1"); err != nil || st == nil || st.Retries != 1 {
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
