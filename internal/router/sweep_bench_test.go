package router

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultrouter/faultrouter/internal/router/hold"
	"github.com/faultrouter/faultrouter/internal/router/sweep"
	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BenchmarkSweepHeld measures the per-batch cost of the sweep (with the
// batch's breaker begin and commit) when many retries are held behind an open
// breaker, against a baseline in the same run with nothing held: the held
// retries have been moved past now (postpone), so they leave deleted due-index
// entries before now, and nothing is due. It prints the ratio (held/empty);
// nothing is asserted. A sweep whose cost follows the work due keeps it near 1.
//
//	go test -run='^$' -bench=SweepHeld -benchtime=1x ./internal/router
func BenchmarkSweepHeld(b *testing.B) {
	const held, sweeps = 50_000, 200
	perSweep := func(b *testing.B, n int) time.Duration {
		now := time.UnixMilli(1_800_000_000_000)
		brk, err := hold.New(policy.Default(), prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		st, err := store.Open(b.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		c, err := codec.New()
		if err != nil {
			b.Fatal(err)
		}
		r := &Router{store: st, codec: c, owned: map[int32]bool{0: true}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		r.cfg.Now = func() time.Time { return now }
		r.attachBreakers(brk)
		r.swp = sweep.New(policy.Default(), r.cfg.Topics.State, r.log, st, owner{r}, r.alertFunc())
		ref := breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}
		// the provider's timeouts open its breaker
		timeout := event.TaskEvent{TaskID: "t-timeout", Attempt: 1, OccurredAt: event.At(now), Source: "bench", Action: "answer",
			Provider: "acme", Model: "m1", Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "Timeout"}}
		sink := newBatch()
		brk.Begin(now)
		for range 100 {
			brk.Observe(&timeout, &event.Decision{Class: event.ClassNetworkTimeout, Route: event.RouteRetry}, nil, sink, now)
		}
		brk.Commit()
		brk.Begin(now)
		// n retries came due before now, were held and moved past now
		wb := st.NewBatch()
		for i := range n {
			id := fmt.Sprintf("held-%06d", i)
			due := now.UnixMilli() - int64(n) + int64(i)
			s := &task.State{TaskID: id, Pending: &task.PendingRetry{N: 1, NotBefore: due},
				LastEvent: &event.TaskEvent{EventID: "e-" + id, TaskID: id, Attempt: 1, OccurredAt: event.At(now),
					Source: "bench", Action: "answer", Provider: "acme", Model: "m1",
					Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "Timeout"}}}
			if err := wb.Put(0, nil, s, 0); err != nil {
				b.Fatal(err)
			}
			moved := *s
			moved.Pending = &task.PendingRetry{N: 1, NotBefore: due}
			if !brk.HoldRetry(moved.LastEvent, &moved, 0, sink, now) { // held, and moved past now
				b.Fatalf("retry of %s not held behind %s", id, ref)
			}
			if err := wb.Put(0, s, &moved, 0); err != nil {
				b.Fatal(err)
			}
			if i%1000 == 999 { // batches of a router's size
				if err := wb.Commit(); err != nil {
					b.Fatal(err)
				}
				wb = st.NewBatch()
			}
		}
		if err := wb.Commit(); err != nil {
			b.Fatal(err)
		}
		brk.Commit()
		start := time.Now()
		for range sweeps {
			bt := newBatch()
			r.brk.Begin(now)
			if err := r.brk.ReleaseHeld(bt.states, bt.Load, now); err != nil {
				b.Fatal(err)
			}
			if err := r.swp.Sweep(bt, now); err != nil {
				b.Fatal(err)
			}
			if err := r.publishDue(bt, now); err != nil {
				b.Fatal(err)
			}
			if len(bt.touched) != 0 {
				b.Fatalf("%d tasks due, want none", len(bt.touched))
			}
			r.brk.Commit()
		}
		return time.Since(start) / sweeps
	}
	for range b.N {
		empty := perSweep(b, 0)
		full := perSweep(b, held)
		b.ReportMetric(float64(empty.Microseconds()), "µs/sweep-empty")
		b.ReportMetric(float64(full.Microseconds()), "µs/sweep-held")
		b.ReportMetric(float64(full)/float64(empty), "held/empty")
	}
}
