package policy

import (
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// BenchmarkDecide measures the default policy's decision per event on the
// mix of make bench's backlog (internal/workload): tasks of three attempts,
// mostly transient timeouts, then rate limits (the third attempt an exact
// redelivery), fixable validation errors, refusals, credentials, business
// rejections, writes without receipt and successes. One op is one event,
// decided on its task's evolving state, as the router does.
//
//	go test -run='^$' -bench=Decide -benchmem ./pkg/policy
func BenchmarkDecide(b *testing.B) { benchmarkDecide(b, Default()) }

func benchmarkDecide(b *testing.B, p *Policy) {
	now := time.UnixMilli(1_800_000_000_000)
	const tasks = 100
	evs := make([][3]event.TaskEvent, tasks)
	for i := range tasks {
		for n := 1; n <= 3; n++ {
			evs[i][n-1] = workload.Event("bench", 1, i, n, now.Add(time.Duration(n)*1500*time.Millisecond))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var st task.State
	for i := 0; i < b.N; i++ {
		ev := &evs[(i/3)%tasks][i%3]
		if i%3 == 0 {
			st = task.State{}
		}
		_ = p.DecideEvent(ev, &st, nil, now)
	}
}
